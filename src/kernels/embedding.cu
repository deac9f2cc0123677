// Token embedding: its backward (#21) and the training forward's token + position sum; launched
// by embedding.rs. Shapes: ids (N,) u32; demb (N, C) f32; out (V, C) f32, a copy of the gradient it adds to.
#include "common.cuh"

// out[ids[i], :] += demb[i, :] for every token row i, one block a row (grid-strided), f32
// atomics: a token that repeats adds its rows in no fixed order (as torch's index_add_ on
// CUDA). candle's index_add walked the rows one after another: 4.2 ms for gpt2's 8192 tokens.
// Ids at or beyond V are skipped (the caller checks them).
extern "C" __global__ void tb_embedding_bwd(const unsigned int* ids, const float* demb, float* out, long rows,
                                            int c, long vocab) {
  for (long i = blockIdx.x; i < rows; i += gridDim.x) {
    const long id = ids[i];
    if (id >= vocab) continue;
    for (int k = threadIdx.x; k < c; k += blockDim.x) atomicAdd(&out[id * c + k], demb[i * c + k]);
  }
}

// Token + position embedding (the training forward): out[i, :] = wte[ids[i], :] + wpe[i % T, :],
// the sum in f32 rounded once to the storage type (candle's gather then broadcast add, in one
// pass), 16-byte vectors. Ids at or beyond V give zero rows (the caller checks them).
// Shapes: ids (N,) u32, N = B·T; wte (V, C), wpe (≥ T, C), out (N, C); CV vectors a row.
template <typename T>
__device__ void embedding_fwd(const unsigned int* ids, const Vec16<T>* wte, const Vec16<T>* wpe, Vec16<T>* out,
                              long rows, int t_len, int cv, long vocab) {
  constexpr int E = 16 / sizeof(T);
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < rows * cv; i += (long)gridDim.x * blockDim.x) {
    const long r = i / cv, v = i % cv, id = ids[r];
    const Vec16<T> b = wpe[(r % t_len) * cv + v];
    Vec16<T> a = b, s;
    if (id < vocab) a = wte[id * cv + v];
#pragma unroll
    for (int j = 0; j < E; j++) s.e[j] = from_f<T>(id < vocab ? to_f(a.e[j]) + to_f(b.e[j]) : 0.f);
    out[i] = s;
  }
}

#define INSTANTIATE(T, S)                                                                               \
  extern "C" __global__ void tb_embedding_fwd_##S(const unsigned int* ids, const Vec16<T>* wte,         \
                                                  const Vec16<T>* wpe, Vec16<T>* out, long rows, int t_len, \
                                                  int cv, long vocab) {                                 \
    embedding_fwd<T>(ids, wte, wpe, out, rows, t_len, cv, vocab);                                       \
  }
FOR_TYPES(INSTANTIATE)
