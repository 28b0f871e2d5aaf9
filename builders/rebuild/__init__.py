"""The dev loop for a patched source tree: split it into layers (devtree), and read back from a build's log what
each layer reused (reuse) and what ccache did inside the compile (ccache_stats)."""
