// Decode projections at 1-4 rows for nn.Linear weights (#20), launched by gemv.rs:
// y = act(x Wᵀ + b). cuBLAS's small-M kernels read BLOOM's decode weights at about a quarter of
// the copy bandwidth (split-K plus a reduce for the 1024-wide outputs: docs/perf-notes.md).
// Shapes: x (M, K), W (N, K), b (N,), y (M, N), contiguous; M <= 4; K whole 16-byte vectors
// (KV of them a row); the dot products in gemv.cuh.
#include "gemv.cuh"
#include "last_block_norm.cuh"

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

// The GEMV with the residual add and the next LayerNorm (last_block_norm.cuh): s = r + (x Wᵀ + b),
// each sum rounded to T as the composed ops round them, then y = LN(s) with lw, lb. r, s, y
// (M, n); the norm's width is the GEMV's n, at most NORM_VECS vectors a thread (4096 bf16).
constexpr int NORM_VECS = 2;
template <typename T, int M>
__device__ void gemv_add_norm(const Vec16<T>* x, const Vec16<T>* w, const T* b, const T* r, const T* lw,
                              const T* lb, T* s, T* y, int n, int kv, float eps) {
  __shared__ float part[COLS][SPLIT][M];
  gemv_parts<T, M>(x, w, n, kv, part);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * COLS + local;
  if (col < n && slice == 0 && lane < M) {
    const long at = (long)lane * n + col;
    const float v = to_f(from_f<T>(gemv_finish<M>(part, local, lane, to_f(b[col]), 0)));
    s[at] = from_f<T>(to_f(r[at]) + v);
  }
  last_block_layer_norm<T, M, NORM_VECS>(s, lw, lb, y, n, eps);
}

// Blocks an SM the fused kernels keep resident: the plain GEMV's (its registers), so the
// norm's registers, used by the last block alone, do not cost the GEMV its occupancy.
#define NORM_BLOCKS(M) ((M) == 1 ? 8 : (M) == 2 ? 6 : 4)

#define INSTANTIATE_M(T, S, M)                                                                  \
  extern "C" __global__ void tb_gemv##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                              T* y, int n, int kv, int act) {                   \
    gemv<T, M>(x, w, b, y, n, kv, act);                                                         \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256, NORM_BLOCKS(M)) tb_gemv_add_norm##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                                       const T* r, const T* lw, const T* lb, T* s, T* y, \
                                                       int n, int kv, float eps) {              \
    gemv_add_norm<T, M>(x, w, b, r, lw, lb, s, y, n, kv, eps);                                  \
  }
#define INSTANTIATE(T, S) INSTANTIATE_M(T, S, 1) INSTANTIATE_M(T, S, 2) INSTANTIATE_M(T, S, 3) INSTANTIATE_M(T, S, 4)
FOR_TYPES(INSTANTIATE)
