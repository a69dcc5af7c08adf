"""CPU code generation: C++ kernels with OpenMP and SIMD, and the build that caches them."""
