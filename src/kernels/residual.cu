// The training step's residual adds in 16-byte vectors (#21), launched by residual.rs: candle's
// contiguous add moves 2 bytes a thread (`badd_bf16`: 49 calls, 1.55 ms of gpt2's 29 ms step).
// The sum is taken in f32 and rounded once to the storage type.
// Shapes: a, b, out (n,) contiguous; V = n / (16 / sizeof(T)) vectors.
#include "common.cuh"

template <typename T>
__device__ void add_vec(const Vec16<T>* a, const Vec16<T>* b, Vec16<T>* out, long V) {
  constexpr int E = 16 / sizeof(T);
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < V; i += (long)gridDim.x * blockDim.x) {
    const Vec16<T> x = a[i], y = b[i];
    Vec16<T> s;
#pragma unroll
    for (int j = 0; j < E; j++) s.e[j] = from_f<T>(to_f(x.e[j]) + to_f(y.e[j]));
    out[i] = s;
  }
}

#define INSTANTIATE(T, S)                                                                                   \
  extern "C" __global__ void tb_add_vec_##S(const Vec16<T>* a, const Vec16<T>* b, Vec16<T>* out, long V) { \
    add_vec<T>(a, b, out, V);                                                                               \
  }
FOR_TYPES(INSTANTIATE)
