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

// A decode step's input rows (`--fused step-io`): x = wte[ids[r]], plus wpe[positions[r]]
// where wpe is given (GPT-2: the sum in f32 rounded once, as embedding_fwd), then where w is
// given the LayerNorm of x with weight w and bias b (BLOOM's word_embeddings_layernorm:
// statistics in f32, two passes over the row held in registers). One block of EMB_THREADS a
// row, EMB_V 16-byte vectors a thread at most (C ≤ EMB_V·EMB_THREADS·E). In one kernel with a
// programmatic edge instead of candle's gathers, cast, add or norm. Ids ≥ V give zero rows.
// Shapes: ids (B,) u32, positions (B,) f32, wte (V, C), wpe (≥ P, C), w and b (C,), out (B, C).
constexpr int EMB_THREADS = 128, EMB_V = 4;
template <typename T>
__device__ void embed_rows(const unsigned int* ids, const Vec16<T>* wte, const Vec16<T>* wpe,
                           const float* positions, const T* w, const T* b, Vec16<T>* out, int cv, long vocab,
                           float eps) {
  constexpr int E = 16 / sizeof(T);
  __shared__ float sh[32];
  const long r = blockIdx.x, id = ids[r];
  const long pos = wpe ? (long)positions[r] : 0;
  float x[EMB_V][E];
#pragma unroll
  for (int k = 0; k < EMB_V; k++) {
    const int v = threadIdx.x + k * EMB_THREADS;
    if (v >= cv) continue;
    const Vec16<T> a = id < vocab ? wte[id * cv + v] : Vec16<T>{};
    Vec16<T> p{};
    if (wpe) p = wpe[pos * cv + v];
#pragma unroll
    for (int e = 0; e < E; e++)
      x[k][e] = id >= vocab ? 0.f : wpe ? to_f(from_f<T>(to_f(a.e[e]) + to_f(p.e[e]))) : to_f(a.e[e]);
  }
  float mean = 0.f, rstd = 1.f;
  if (w) {
    const int c = cv * E;
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < EMB_V; k++)
      if (threadIdx.x + k * EMB_THREADS < cv)
#pragma unroll
        for (int e = 0; e < E; e++) s += x[k][e];
    mean = block_sum(s, sh) / c;
    float var = 0.f;
#pragma unroll
    for (int k = 0; k < EMB_V; k++)
      if (threadIdx.x + k * EMB_THREADS < cv)
#pragma unroll
        for (int e = 0; e < E; e++) var += (x[k][e] - mean) * (x[k][e] - mean);
    rstd = 1.f / sqrtf(block_sum(var, sh) / c + eps);
  }
#pragma unroll
  for (int k = 0; k < EMB_V; k++) {
    const int v = threadIdx.x + k * EMB_THREADS;
    if (v >= cv) continue;
    Vec16<T> y;
#pragma unroll
    for (int e = 0; e < E; e++) {
      const int ch = v * E + e;
      y.e[e] = from_f<T>(w ? (x[k][e] - mean) * rstd * to_f(w[ch]) + to_f(b[ch]) : x[k][e]);
    }
    out[r * cv + v] = y;
  }
}

#define EMBED_ROWS(T, S)                                                                                 \
  extern "C" __global__ void __launch_bounds__(EMB_THREADS) tb_embed_rows_##S(                           \
      const unsigned int* ids, const Vec16<T>* wte, const Vec16<T>* wpe, const float* positions,         \
      const T* w, const T* b, Vec16<T>* out, int cv, long vocab, float eps) {                            \
    pdl_begin();                                                                                         \
    embed_rows<T>(ids, wte, wpe, positions, w, b, out, cv, vocab, eps);                                  \
  }
FOR_TYPES(EMBED_ROWS)

#define INSTANTIATE(T, S)                                                                               \
  extern "C" __global__ void tb_embedding_fwd_##S(const unsigned int* ids, const Vec16<T>* wte,         \
                                                  const Vec16<T>* wpe, Vec16<T>* out, long rows, int t_len, \
                                                  int cv, long vocab) {                                 \
    embedding_fwd<T>(ids, wte, wpe, out, rows, t_len, cv, vocab);                                       \
  }
FOR_TYPES(INSTANTIATE)
