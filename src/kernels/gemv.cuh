// The decode GEMV's dot products (#20), shared by gemv.cu (y = act(x Wᵀ + b) to memory) and
// oneshot.cu (the same y pushed to every rank's one-shot buffer, #34).
// Shapes: x (M, K), W (N, K), contiguous; M <= 4; K whole 16-byte vectors (KV of them a row).
// Output column n: W's row n read once, dotted with each row of x, sums in f32.
#pragma once
#include "common.cuh"

// SPLIT warps a column, each over every SPLIT-th run of 32 vectors of the row (more loads in
// flight: one warp a column read 0.5-1.4 TB/s under ncu, results/h100/gemv-run1), their sums
// met in shared memory. Block: 32 * SPLIT * C threads, columns blockIdx.x * C + local; C is
// COLS, but gemv.cu takes C = 1 for one row, where a column a block stepped bloom-7b1 5.228 ->
// 5.198 ms (results/h100x2/ablate1, its sweep); oneshot.cu's pushing GEMV keeps COLS.
constexpr int SPLIT = 4, COLS = 2;

// Row m of x against W's vector i, added to acc[m]; with STATS, row m's values and squares
// added to s1[m] and s2[m] (the LayerNorm folded into the weights, gemv.cu's tb_gemv_ln). wv by
// value: a reference into W made nvcc load it as eight 2-byte loads (results/h200x2/ew-run2).
template <typename T, int M, bool STATS = false>
__device__ __forceinline__ void gemv_dot(const Vec16<T> wv, const Vec16<T>* x, int kv, int i, float* acc,
                                         float* s1 = nullptr, float* s2 = nullptr) {
  constexpr int E = 16 / sizeof(T);
#pragma unroll
  for (int m = 0; m < M; m++) {
    const Vec16<T> xv = x[(long)m * kv + i];
#pragma unroll
    for (int j = 0; j < E; j++) {
      const float xf = to_f(xv.e[j]);
      acc[m] += to_f(wv.e[j]) * xf;
      if constexpr (STATS) {
        s1[m] += xf;
        s2[m] += xf * xf;
      }
    }
  }
}

// part[local][slice][m]: slice `slice`'s sum of row m against the block's column `local`,
// complete for every thread after the __syncthreads() at the end; with STATS, stat[local][slice]
// [m] the slice's sums of row m's values and squares (each column's warps read all of x).
template <typename T, int M, int C = COLS, bool STATS = false>
__device__ void gemv_parts(const Vec16<T>* x, const Vec16<T>* w, int n, int kv, float (*part)[SPLIT][M],
                           float2 (*stat)[SPLIT][M] = nullptr) {
  constexpr int STEP = 32 * SPLIT;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * C + local;
  float acc[M], s1[M], s2[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = s1[m] = s2[m] = 0.f;
  if (col < n) {
    const Vec16<T>* row = w + (long)col * kv;
#pragma unroll 4
    for (int i = slice * 32 + lane; i < kv; i += STEP) gemv_dot<T, M, STATS>(row[i], x, kv, i, acc, s1, s2);
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
    acc[m] = warp_sum(acc[m]);
    if (lane == 0) part[local][slice][m] = acc[m];
    if constexpr (STATS) {
      const float2 st = make_float2(warp_sum(s1[m]), warp_sum(s2[m]));
      if (lane == 0) stat[local][slice][m] = st;
    }
  }
  __syncthreads();
}

// Row m of the block's column `local`, unrounded: the slices' sums, the bias, the act (0 none,
// 1 GELU, tanh approximation).
template <int M>
__device__ __forceinline__ float gemv_finish(const float (*part)[SPLIT][M], int local, int m, float bias, int act) {
  float v = bias;
#pragma unroll
  for (int s = 0; s < SPLIT; s++) v += part[local][s][m];
  if (act == 1) v = gelu_tanh(v);
  return v;
}
