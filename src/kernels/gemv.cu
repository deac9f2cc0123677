// Decode projections at 1-4 rows for nn.Linear weights (#20), launched by gemv.rs:
// y = act(x Wᵀ + b). cuBLAS's small-M kernels read BLOOM's decode weights at about a quarter of
// the copy bandwidth (split-K plus a reduce for the 1024-wide outputs: docs/perf-notes.md).
// Shapes: x (M, K), W (N, K), b (N,), y (M, N), contiguous; M <= 4; K whole 16-byte vectors
// (KV of them a row). Output column n: W's row n read once, dotted with each row of x, sums in
// f32; act: 0 none, 1 GELU (tanh approximation).
#include "common.cuh"

// SPLIT warps a column, each over every SPLIT-th run of 32 vectors of the row (more loads in
// flight: one warp a column read 0.5-1.4 TB/s under ncu, results/h100/gemv-run1), their sums
// met in shared memory. Block: 32 * SPLIT * COLS threads.
constexpr int SPLIT = 4, COLS = 2;

template <typename T, int M>
__device__ void gemv(const Vec16<T>* x, const Vec16<T>* w, const T* b, T* y, int n, int kv, int act) {
  constexpr int E = 16 / sizeof(T);
  __shared__ float part[COLS][SPLIT][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * COLS + local;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; m++) acc[m] = 0.f;
  if (col < n) {
    const Vec16<T>* row = w + (long)col * kv;
#pragma unroll 4
    for (int i = slice * 32 + lane; i < kv; i += 32 * SPLIT) {
      const Vec16<T> wv = row[i];
#pragma unroll
      for (int m = 0; m < M; m++) {
        const Vec16<T> xv = x[(long)m * kv + i];
#pragma unroll
        for (int j = 0; j < E; j++) acc[m] += to_f(wv.e[j]) * to_f(xv.e[j]);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; m++) {
    acc[m] = warp_sum(acc[m]);
    if (lane == 0) part[local][slice][m] = acc[m];
  }
  __syncthreads();
  if (col >= n || slice != 0 || lane >= M) return;
  // Lane m of the column's first warp finishes row m: the slices' sums, the bias, the act.
  float v = to_f(b[col]);
#pragma unroll
  for (int s = 0; s < SPLIT; s++) v += part[local][s][lane];
  if (act == 1) v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
  y[(long)lane * n + col] = from_f<T>(v);
}

#define INSTANTIATE_M(T, S, M)                                                                  \
  extern "C" __global__ void tb_gemv##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                              T* y, int n, int kv, int act) {                   \
    gemv<T, M>(x, w, b, y, n, kv, act);                                                         \
  }
#define INSTANTIATE(T, S) INSTANTIATE_M(T, S, 1) INSTANTIATE_M(T, S, 2) INSTANTIATE_M(T, S, 3) INSTANTIATE_M(T, S, 4)
FOR_TYPES(INSTANTIATE)
