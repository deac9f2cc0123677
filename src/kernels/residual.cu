// The training step's residual adds in 16-byte vectors (#21), launched by residual.rs: candle's
// contiguous add moves 2 bytes a thread (`badd_bf16`: 49 calls, 1.55 ms of gpt2's 29 ms step).
// The sum is taken in f32 and rounded once to the storage type. With the residual branch's
// dropout (dropout.cuh's hashed mask) in the same pass: forward a + keep(b), backward a + b and
// keep(a + b), each rounded as the separate dropout kernel rounds.
// Shapes: a, b, out, dropped (n,) contiguous; V = n / (16 / sizeof(T)) vectors.
#include "common.cuh"
#include "dropout.cuh"

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

// out = a + keep(b) / (1 − p), or with `dropped`: out = a + b, dropped = keep(out) / (1 − p).
// A vector's elements start at an even flat index: one dropout word a pair.
template <typename T>
__device__ void add_drop_vec(const Vec16<T>* a, const Vec16<T>* b, Vec16<T>* out, Vec16<T>* dropped, long V,
                             unsigned long long key, unsigned int thresh, float scale) {
  constexpr int E = 16 / sizeof(T);
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < V; i += (long)gridDim.x * blockDim.x) {
    const Vec16<T> x = a[i], y = b[i];
    Vec16<T> s, d;
    unsigned int w = 0;
#pragma unroll
    for (int j = 0; j < E; j++) {
      if (j % 2 == 0) w = keep_word(key, (unsigned long long)(i * E + j) >> 1);
      const bool kept = (j % 2 ? w >> 16 : w & 0xffffu) >= thresh;
      if (dropped) {
        s.e[j] = from_f<T>(to_f(x.e[j]) + to_f(y.e[j]));
        d.e[j] = from_f<T>(kept ? to_f(s.e[j]) * scale : 0.f);
      } else {
        s.e[j] = from_f<T>(to_f(x.e[j]) + to_f(from_f<T>(kept ? to_f(y.e[j]) * scale : 0.f)));
      }
    }
    out[i] = s;
    if (dropped) dropped[i] = d;
  }
}

#define INSTANTIATE(T, S)                                                                                   \
  extern "C" __global__ void tb_add_vec_##S(const Vec16<T>* a, const Vec16<T>* b, Vec16<T>* out, long V) { \
    add_vec<T>(a, b, out, V);                                                                               \
  }                                                                                                         \
  extern "C" __global__ void tb_add_drop_vec_##S(const Vec16<T>* a, const Vec16<T>* b, Vec16<T>* out,       \
                                                 Vec16<T>* dropped, long V, unsigned long long key,        \
                                                 unsigned int thresh, float scale) {                       \
    add_drop_vec<T>(a, b, out, dropped, V, key, thresh, scale);                                             \
  }
FOR_TYPES(INSTANTIATE)
