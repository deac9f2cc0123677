// Dropout (#10) with the hashed mask of dropout.cuh, and that mask as u8; launched by
// dropout.rs. Shapes: x, y (n,) storage type T, flat; out (n,) u8. Grid-stride loops over n.
#include "common.cuh"
#include "dropout.cuh"

// Dropout of a whole tensor with the hashed mask: y = x ⊙ keep / (1 − p). Its own backward
// (the same mask, the same scale), so one kernel serves both directions.
template <typename T>
__device__ void dropout_hash(const T* x, T* y, long n, unsigned long long key, unsigned int thresh, float scale) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    y[i] = from_f<T>(keep_bit(key, (unsigned long long)i, thresh) ? to_f(x[i]) * scale : 0.f);
}
// The hashed mask as u8 (1 = kept): for the composed-ops path and the tests.
extern "C" __global__ void tb_dropout_mask(uint8_t* out, long n, unsigned long long key, unsigned int thresh) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    out[i] = keep_bit(key, (unsigned long long)i, thresh) ? 1 : 0;
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_dropout_##S(const T* x, T* y, long n, unsigned long long key,                 \
                                            unsigned int thresh, float scale) {                               \
    dropout_hash<T>(x, y, n, key, thresh, scale);                                                             \
  }
FOR_TYPES(INSTANTIATE)
