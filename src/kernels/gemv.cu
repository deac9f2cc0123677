// Decode projections at 1-4 rows for nn.Linear weights (#20), launched by gemv.rs:
// y = act(x Wᵀ + b). cuBLAS's small-M kernels read BLOOM's decode weights at about a quarter of
// the copy bandwidth (split-K plus a reduce for the 1024-wide outputs: docs/perf-notes.md).
// Shapes: x (M, K), W (N, K), b (N,), y (M, N), contiguous; M <= 4; K whole 16-byte vectors
// (KV of them a row); the dot products in gemv.cuh.
#include "gemv.cuh"

template <typename T, int M>
__device__ void gemv(const Vec16<T>* x, const Vec16<T>* w, const T* b, T* y, int n, int kv, int act) {
  __shared__ float part[COLS][SPLIT][M];
  gemv_parts<T, M>(x, w, n, kv, part);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * COLS + local;
  if (col >= n || slice != 0 || lane >= M) return;
  // Lane m of the column's first warp finishes row m.
  y[(long)lane * n + col] = from_f<T>(gemv_finish<M>(part, local, lane, to_f(b[col]), act));
}

// One row, the residual add and the LayerNorm before the projection in the prologue
// (`--fused norm-gemv`): y = act(LN(x + r) Wᵀ + b), and s = x + r written by block 0. Every
// block normalises the row itself (it reads the whole row anyway), so no kernel or grid-wide
// wait stands between the add + norm and the GEMV: a block issues its weight loads first, and
// the row's loads and the two reductions run while they are in flight. The add + norm kernel
// cost 2.2–3.1 µs a norm inside the graphed step (results/h100x2/ablate1). The arithmetic is
// add_layer_norm_vec's (layer_norm.cu): the sum rounded to T, mean and variance in f32 over the
// rounded sum, the normed row rounded to T before the dot products, as the GEMV reads it.
// Shapes: x, r, s (1, K); lw, lb (K,); K ≤ 32·SPLIT·NV vectors (a column's lanes hold the row).
constexpr int NV = 4;  // a lane's vectors of the row: K ≤ 4096 (bf16 / f16)

// Sums of the block's threads, each value counted by every column (COLS of them), to all.
__device__ __forceinline__ float row_sum(float v, float* sh) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = warp_sum(v);
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = 0.f;
#pragma unroll
  for (int w = 0; w < SPLIT; w++) t += sh[w];  // the first column's warps: the row once
  return t;
}

template <typename T>
__device__ void gemv_norm(const Vec16<T>* x, const Vec16<T>* r, const Vec16<T>* lw, const Vec16<T>* lb, float eps,
                          const Vec16<T>* w, const T* b, T* y, Vec16<T>* s, int n, int kv, int act) {
  constexpr int E = 16 / sizeof(T);
  __shared__ float part[COLS][SPLIT][1];
  __shared__ float sh_mean[COLS * SPLIT], sh_var[COLS * SPLIT];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * COLS + local;
  const int c = kv * E;
  // The weights first: at most NV 16-byte loads a lane, all in flight (streamed: the row stays in L1).
  Vec16<T> wv[NV];
  const Vec16<T>* row = w + (long)min(col, n - 1) * kv;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int i = slice * 32 + lane + j * 32 * SPLIT;
    if (i < kv) {
      const uint4 u = __ldcs(reinterpret_cast<const uint4*>(row + i));
      wv[j] = *reinterpret_cast<const Vec16<T>*>(&u);
    }
  }
  // The row: x + r rounded to T, its sum.
  Vec16<T> h[NV];
  float sum = 0.f;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int i = slice * 32 + lane + j * 32 * SPLIT;
    if (i < kv) {
      const Vec16<T> xv = x[i], rv = r[i];
#pragma unroll
      for (int e = 0; e < E; e++) {
        h[j].e[e] = from_f<T>(to_f(xv.e[e]) + to_f(rv.e[e]));
        sum += to_f(h[j].e[e]);
      }
      if (blockIdx.x == 0 && local == 0) s[i] = h[j];
    }
  }
  const float mean = row_sum(sum, sh_mean) / c;
  float var = 0.f;
#pragma unroll
  for (int j = 0; j < NV; j++)
    if (slice * 32 + lane + j * 32 * SPLIT < kv)
#pragma unroll
      for (int e = 0; e < E; e++) var += (to_f(h[j].e[e]) - mean) * (to_f(h[j].e[e]) - mean);
  const float rstd = rsqrtf(row_sum(var, sh_var) / c + eps);
  float acc = 0.f;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int i = slice * 32 + lane + j * 32 * SPLIT;
    if (i < kv) {
      const Vec16<T> gv = lw[i], bv = lb[i];
#pragma unroll
      for (int e = 0; e < E; e++) {
        const T xn = from_f<T>((to_f(h[j].e[e]) - mean) * rstd * to_f(gv.e[e]) + to_f(bv.e[e]));
        acc += to_f(wv[j].e[e]) * to_f(xn);
      }
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) part[local][slice][0] = acc;
  __syncthreads();
  if (col >= n || slice != 0 || lane != 0) return;
  y[col] = from_f<T>(gemv_finish<1>(part, local, 0, to_f(b[col]), act));
}

#define INSTANTIATE_M(T, S, M)                                                                  \
  extern "C" __global__ void tb_gemv##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                              T* y, int n, int kv, int act) {                   \
    gemv<T, M>(x, w, b, y, n, kv, act);                                                         \
  }
#define INSTANTIATE(T, S)                                                                        \
  INSTANTIATE_M(T, S, 1) INSTANTIATE_M(T, S, 2) INSTANTIATE_M(T, S, 3) INSTANTIATE_M(T, S, 4)      \
  extern "C" __global__ void __launch_bounds__(256, 3) tb_gemv_norm_##S(const Vec16<T>* x, const Vec16<T>* r, const Vec16<T>* lw, \
                                              const Vec16<T>* lb, float eps, const Vec16<T>* w,   \
                                              const T* b, T* y, Vec16<T>* s, int n, int kv, int act) { \
    gemv_norm<T>(x, r, lw, lb, eps, w, b, y, s, n, kv, act);                                       \
  }
FOR_TYPES(INSTANTIATE)
