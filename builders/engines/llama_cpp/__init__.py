"""llama.cpp: its native build (image.py: plan, preflight gates.py, test stage checks.py, source tree facts tree.py),
the tiny GGUF model its checks serve (gguf_model.py) and how a pool serves it (serve.py)."""
