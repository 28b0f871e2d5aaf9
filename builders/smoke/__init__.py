"""Smoke tests of a built image: a tiny model, vLLM pools, the class-aware router, mixed traffic, gates."""
