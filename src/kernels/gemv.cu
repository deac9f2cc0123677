// Decode projections at 1-4 rows for nn.Linear weights (#20), launched by gemv.rs:
// y = act(x Wᵀ + b) [+ r]. cuBLAS's small-M kernels read BLOOM's decode weights at about a
// quarter of the copy bandwidth (split-K plus a reduce for the 1024-wide outputs:
// docs/perf-notes.md).
// Shapes: x (M, K), W (N, K), b (N,), r and y (M, N), contiguous; M <= 4; K whole 16-byte
// vectors (KV of them a row); the dot products in gemv.cuh. b may be null (no bias: the LM
// head), r too (no residual: `--fused norm-fold` adds it here, not in the norm after); stats
// and clear, a norm's slots (NORM_SLOTS lines of NORM_LINE f64, one row), may be null.
#include "gemv.cuh"

// `--fused norm-stats` (one row): a norm's statistics summed by the GEMV that writes its
// input, read by the folded GEMV after it. Slot s, the first two doubles of line s (NORM_LINE
// doubles, 128 bytes, apart), holds (Σ y, Σ y²) over the columns of the blocks ≡ s (mod
// NORM_SLOTS): f64 adds at the L2, one line a slot, since adds to one line queue one after
// another (eight slots in one line cost 2-3 µs a norm: results/h100/gate-run49). The bf16 / f16
// values are exact in f64 and their sums exact while a row spans under 2^24 of its smallest
// nonzero value, so the order the blocks add in changes only the last bits of Σ y², 2^-53 of
// it, where f32's rounding is 2^-24 (models/cache.rs keeps the slots, zeroed for each
// generation; models/norm_fold.rs says which GEMV sums, reads and clears which).
constexpr int NORM_SLOTS = 32, NORM_LINE = 16;

template <typename T, int M>
__device__ void gemv(const Vec16<T>* x, const Vec16<T>* w, const T* b, const T* r, double* stats, T* y,
                     int n, int kv, int act) {
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
  const T out = from_f<T>(v);
  y[(long)lane * n + col] = out;
  if (M == 1 && stats) {  // the next norm's statistics of the values stored (reductions)
    double* s = stats + (blockIdx.x % NORM_SLOTS) * NORM_LINE;
    const double f = to_f(out);
    atomicAdd(s, f);
    atomicAdd(s + 1, f * f);
  }
}

// y = act(LN(x) Wᵀ + b) with the LayerNorm's weight and bias folded into W and b at load
// (models/norm_fold.rs): W' = W·diag(γ), b' = b + W β, and sb[n] = (Σ_k W'[n, k], b'[n]) in f32,
// so that LN(x) W'ᵀ + b' = rstd·(x W'ᵀ − mean·Σ W') + b'. SUMMED: the statistics of x from
// `stats` (the slots the GEMV that wrote x summed into, gemv above), else from the same loads
// as the dot products. Either way no pass before them, and no norm kernel. `clear` (may be
// null): the slots of the norm before this one, whose folded GEMV has ended (each kernel of
// the step waits for the one before), zeroed for the next step's.
template <typename T, int M, bool SUMMED>
__device__ void gemv_ln(const Vec16<T>* x, const Vec16<T>* w, const float2* sb, const double* stats,
                        double* clear, T* y, int n, int kv, int act, float eps) {
  static_assert(!SUMMED || M == 1, "summed statistics at one row");
  constexpr int C = M == 1 ? 1 : COLS;
  __shared__ float part[C][SPLIT][M];
  __shared__ float2 stat[C][SPLIT][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int local = warp / SPLIT, slice = warp % SPLIT, col = blockIdx.x * C + local;
  const bool finishes = col < n && slice == 0 && lane < M;
  const float2 c = finishes ? sb[col] : make_float2(0.f, 0.f);  // loaded under the dot products
  if (M == 1 && clear && blockIdx.x == 0 && threadIdx.x < NORM_SLOTS)
    *reinterpret_cast<double2*>(clear + threadIdx.x * NORM_LINE) = make_double2(0., 0.);
  // SUMMED: lane s of the first warp copies slot s into shared memory under the dot products
  // (a copy, not a load: no registers held by the loop).
  __shared__ double2 slots[NORM_SLOTS];
  const bool copies = SUMMED && warp == 0;
  if (copies) {
    const unsigned to = (unsigned)__cvta_generic_to_shared(&slots[lane]);
    // "memory": kept before the loop, whose loads it overlaps.
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(to), "l"(stats + lane * NORM_LINE)
                 : "memory");
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  gemv_parts<T, M, C, !SUMMED>(x, w, n, kv, part, stat);
  const float inv_k = 1.f / (kv * (16 / (int)sizeof(T)));
  float mean = 0.f, var = 0.f;
  if constexpr (SUMMED) {
    if (warp != 0) return;  // lane 0 of warp 0 finishes the one row
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    double2 slot = slots[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // the slots in a fixed order (their own adds are not)
      slot.x += __shfl_xor_sync(0xffffffffu, slot.x, o);
      slot.y += __shfl_xor_sync(0xffffffffu, slot.y, o);
    }
    const double inv_kd = 1. / (kv * (16 / (int)sizeof(T)));  // 1/K exact for any K in f64
    const double mean_d = slot.x * inv_kd;
    mean = (float)mean_d;
    var = (float)fmax(slot.y * inv_kd - mean_d * mean_d, 0.);
  }
  if (!finishes) return;
  if constexpr (!SUMMED) {
    float s1 = 0.f, s2 = 0.f;
#pragma unroll
    for (int s = 0; s < SPLIT; s++) {
      s1 += stat[local][s][lane].x;
      s2 += stat[local][s][lane].y;
    }
    mean = s1 * inv_k;
    var = fmaxf(s2 * inv_k - mean * mean, 0.f);
  }
  float v = rsqrtf(var + eps) * (gemv_finish<M>(part, local, lane, 0.f, 0) - mean * c.x) + c.y;
  if (act == 1) v = gelu_tanh(v);
  y[(long)lane * n + col] = from_f<T>(v);
}

// One row: 32 registers a thread, 16 blocks an SM (34 unbounded since the optional bias: 12).
#define ONE_ROW __launch_bounds__(128, 16)
#define INSTANTIATE_M(T, S, M, BOUNDS)                                                              \
  extern "C" __global__ void BOUNDS tb_gemv##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                                     const T* r, double* stats, T* y, int n, int kv,  \
                                                     int act) {                                      \
    pdl_begin();                                                                                    \
    gemv<T, M>(x, w, b, r, stats, y, n, kv, act);                                                   \
  }                                                                                                 \
  extern "C" __global__ void BOUNDS tb_gemv_ln##M##_##S(const Vec16<T>* x, const Vec16<T>* w,         \
                                                        const float2* sb, const double* stats,       \
                                                        double* clear, T* y, int n, int kv, int act, \
                                                        float eps) {                                 \
    pdl_begin();                                                                                    \
    gemv_ln<T, M, false>(x, w, sb, stats, clear, y, n, kv, act, eps);                               \
  }
#define INSTANTIATE(T, S)                                                                                 \
  INSTANTIATE_M(T, S, 1, ONE_ROW) INSTANTIATE_M(T, S, 2, ) INSTANTIATE_M(T, S, 3, ) INSTANTIATE_M(T, S, 4, ) \
  extern "C" __global__ void ONE_ROW tb_gemv_lns1_##S(const Vec16<T>* x, const Vec16<T>* w, const float2* sb, \
                                                      const double* stats, double* clear, T* y, int n,     \
                                                      int kv, int act, float eps) {                        \
    pdl_begin();                                                                                          \
    gemv_ln<T, 1, true>(x, w, sb, stats, clear, y, n, kv, act, eps);                                      \
  }
FOR_TYPES(INSTANTIATE)
