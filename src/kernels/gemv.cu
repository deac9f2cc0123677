// Decode projections at 1-4 rows for nn.Linear weights (#20), launched by gemv.rs:
// y = act(x Wᵀ + b) [+ r]. cuBLAS's small-M kernels read BLOOM's decode weights at about a
// quarter of the copy bandwidth (split-K plus a reduce for the 1024-wide outputs:
// docs/perf-notes.md).
// Shapes: x (M, K), W (N, K), b (N,), r and y (M, N), contiguous; M <= 4; K whole 16-byte
// vectors (KV of them a row); the dot products in gemv.cuh. b may be null (no bias: the LM
// head), r too (no residual: `--fused norm-fold` adds it here, not in the norm after).
#include "gemv.cuh"

template <typename T, int M>
__device__ void gemv(const Vec16<T>* x, const Vec16<T>* w, const T* b, const T* r, T* y, int n, int kv,
                     int act) {
  constexpr int C = M == 1 ? 1 : COLS;  // columns a block (gemv.cuh)
  __shared__ float part[C][SPLIT][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * C + local;
  const bool finishes = col < n && slice == 0 && lane < M;  // lane m finishes row m
  // The residual, written two or more kernels back, loaded under the dot products.
  const float res = r && finishes ? to_f(r[(long)lane * n + col]) : 0.f;
  gemv_parts<T, M, C>(x, w, n, kv, part);
  if (!finishes) return;
  float v = gemv_finish<M>(part, local, lane, b ? to_f(b[col]) : 0.f, act);
  // Rounded before the add, as the branch's output was before the add kernel.
  if (r) v = res + to_f(from_f<T>(v));
  y[(long)lane * n + col] = from_f<T>(v);
}

// y = act(LN(x) Wᵀ + b) with the LayerNorm's weight and bias folded into W and b at load
// (models/norm_fold.rs): W' = W·diag(γ), b' = b + W β, and sb[n] = (Σ_k W'[n, k], b'[n]) in f32,
// so that LN(x) W'ᵀ + b' = rstd·(x W'ᵀ − mean·Σ W') + b'. The statistics of x come from the
// same loads as the dot products: no pass before them, and no norm kernel.
template <typename T, int M>
__device__ void gemv_ln(const Vec16<T>* x, const Vec16<T>* w, const float2* sb, T* y, int n, int kv, int act,
                        float eps) {
  constexpr int C = M == 1 ? 1 : COLS;
  __shared__ float part[C][SPLIT][M];
  __shared__ float2 stat[C][SPLIT][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * C + local;
  const bool finishes = col < n && slice == 0 && lane < M;
  const float2 c = finishes ? sb[col] : make_float2(0.f, 0.f);  // loaded under the dot products
  gemv_parts<T, M, C, true>(x, w, n, kv, part, stat);
  if (!finishes) return;
  float s1 = 0.f, s2 = 0.f;
#pragma unroll
  for (int s = 0; s < SPLIT; s++) {
    s1 += stat[local][s][lane].x;
    s2 += stat[local][s][lane].y;
  }
  const float inv_k = 1.f / (kv * (16 / (int)sizeof(T)));
  const float mean = s1 * inv_k, var = fmaxf(s2 * inv_k - mean * mean, 0.f);
  float v = rsqrtf(var + eps) * (gemv_finish<M>(part, local, lane, 0.f, 0) - mean * c.x) + c.y;
  if (act == 1) v = gelu_tanh(v);
  y[(long)lane * n + col] = from_f<T>(v);
}

// One row: 32 registers a thread, 16 blocks an SM (34 unbounded since the optional bias: 12).
#define ONE_ROW __launch_bounds__(128, 16)
#define INSTANTIATE_M(T, S, M, BOUNDS)                                                              \
  extern "C" __global__ void BOUNDS tb_gemv##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                                     const T* r, T* y, int n, int kv, int act) {     \
    pdl_begin();                                                                                    \
    gemv<T, M>(x, w, b, r, y, n, kv, act);                                                          \
  }                                                                                                 \
  extern "C" __global__ void BOUNDS tb_gemv_ln##M##_##S(const Vec16<T>* x, const Vec16<T>* w,         \
                                                        const float2* sb, T* y, int n, int kv,       \
                                                        int act, float eps) {                        \
    pdl_begin();                                                                                    \
    gemv_ln<T, M>(x, w, sb, y, n, kv, act, eps);                                                    \
  }
#define INSTANTIATE(T, S) \
  INSTANTIATE_M(T, S, 1, ONE_ROW) INSTANTIATE_M(T, S, 2, ) INSTANTIATE_M(T, S, 3, ) INSTANTIATE_M(T, S, 4, )
FOR_TYPES(INSTANTIATE)
