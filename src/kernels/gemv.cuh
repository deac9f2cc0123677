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

// Row m of x against W's vector i, added to acc[m].
template <typename T, int M>
// (wv by value: a reference into W made nvcc load it as eight 2-byte loads, results/h200x2/ew-run2.)
__device__ __forceinline__ void gemv_dot(const Vec16<T> wv, const Vec16<T>* x, int kv, int i, float* acc) {
  constexpr int E = 16 / sizeof(T);
#pragma unroll
  for (int m = 0; m < M; m++) {
    const Vec16<T> xv = x[(long)m * kv + i];
#pragma unroll
    for (int j = 0; j < E; j++) acc[m] += to_f(wv.e[j]) * to_f(xv.e[j]);
  }
}

// A lane's first weight vectors loaded before the wait for the kernel before (`--fused
// early-weights`, gemv.cu's tb_gemv*w kernels): while a norm or the attention runs under a
// programmatic edge, memory is otherwise idle. Only W is read before the wait, as read-only
// (ld.global.nc) loads at clamped, in-range addresses: no branch comes before it, and nothing a
// decode step writes is read early (W is a weight: a GPU test reads the PTX).
constexpr int EARLY_VECTORS = 4;

// part[local][slice][m]: slice `slice`'s sum of row m against the block's column `local`,
// complete for every thread after the __syncthreads() at the end. EARLY: the kernel's
// pdl_begin() is called here, after the first EARLY_VECTORS weight vectors' loads.
template <typename T, int M, int C = COLS, bool EARLY = false>
__device__ void gemv_parts(const Vec16<T>* x, const Vec16<T>* w, int n, int kv, float (*part)[SPLIT][M]) {
  constexpr int STEP = 32 * SPLIT, PRE = EARLY ? EARLY_VECTORS : 0;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * C + local;
  const int first = slice * 32 + lane;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  // Clamped where loaded before the wait (a block's columns past n load and discard).
  const Vec16<T>* row = w + (long)(EARLY ? min(col, n - 1) : col) * kv;
  uint4 pre[PRE > 0 ? PRE : 1];
  if constexpr (EARLY) {
    const uint4* row4 = reinterpret_cast<const uint4*>(row);
#pragma unroll
    for (int p = 0; p < PRE; p++) pre[p] = __ldg(row4 + min(first + p * STEP, kv - 1));
    pdl_begin();
  }
  if (col < n) {
#pragma unroll
    for (int p = 0; p < PRE; p++)
      if (first + p * STEP < kv) gemv_dot<T, M>(*reinterpret_cast<const Vec16<T>*>(&pre[p]), x, kv, first + p * STEP, acc);
#pragma unroll 4
    for (int i = first + PRE * STEP; i < kv; i += STEP) gemv_dot<T, M>(row[i], x, kv, i, acc);
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
    acc[m] = warp_sum(acc[m]);
    if (lane == 0) part[local][slice][m] = acc[m];
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
