// Decode projections at 1-4 rows for nn.Linear weights (#20), launched by gemv.rs:
// y = act(x Wᵀ + b). cuBLAS's small-M kernels read BLOOM's decode weights at about a quarter of
// the copy bandwidth (split-K plus a reduce for the 1024-wide outputs: docs/perf-notes.md).
// Shapes: x (M, K), W (N, K), b (N,), y (M, N), contiguous; M <= 4; K whole 16-byte vectors
// (KV of them a row); the dot products in gemv.cuh. b may be null (no bias: the LM head).
#include "gemv.cuh"

template <typename T, int M>
__device__ void gemv(const Vec16<T>* x, const Vec16<T>* w, const T* b, T* y, int n, int kv, int act) {
  constexpr int C = M == 1 ? 1 : COLS;  // columns a block (gemv.cuh)
  __shared__ float part[C][SPLIT][M];
  gemv_parts<T, M, C>(x, w, n, kv, part);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * C + local;
  if (col >= n || slice != 0 || lane >= M) return;
  // Lane m of the column's first warp finishes row m.
  y[(long)lane * n + col] = from_f<T>(gemv_finish<M>(part, local, lane, b ? to_f(b[col]) : 0.f, act));
}

// One row: 32 registers a thread, 16 blocks an SM (34 unbounded since the optional bias: 12).
#define ONE_ROW __launch_bounds__(128, 16)
#define INSTANTIATE_M(T, S, M, BOUNDS)                                                          \
  extern "C" __global__ void BOUNDS tb_gemv##M##_##S(const Vec16<T>* x, const Vec16<T>* w,      \
                                                     const T* b, T* y, int n, int kv, int act) { \
    pdl_begin();                                                                                \
    gemv<T, M>(x, w, b, y, n, kv, act);                                                         \
  }
#define INSTANTIATE(T, S) \
  INSTANTIATE_M(T, S, 1, ONE_ROW) INSTANTIATE_M(T, S, 2, ) INSTANTIATE_M(T, S, 3, ) INSTANTIATE_M(T, S, 4, )
FOR_TYPES(INSTANTIATE)
