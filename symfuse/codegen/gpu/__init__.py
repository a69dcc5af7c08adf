"""The GPU backend: Triton kernels from the shared fusion plan (kernel.py), host code and
launch (compile.py), ahead-of-time compilation for a GPU architecture (aot.py)."""
