"""specdec's own CPU kernels over GGUF's quantized blocks, compiled on the machine that runs them.

``build`` compiles the C++ sources beside it once per CPU flag set and source version into the cache;
``kernels`` wraps them (ctypes) as matrix products on torch tensors.
"""
