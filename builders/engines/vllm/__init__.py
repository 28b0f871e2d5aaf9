"""vLLM: how its CPU and CUDA images are planned (plan.py, gpu_wheel.py), the checks run in them (image_tests.py)
and how a pool serves it (serve.py)."""
