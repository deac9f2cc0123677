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

// ---- `--fused gemv-wide`: one row, a few wide blocks that launch early and load their weights first ----
// A graph of chained one-row GEMV stages took 2.6 us a stage (bloom-560m's proj), 5.4 (fc) and
// 6.9 (fc2) with a block a column as above, and 1.9-2.1, 3.8 and 5.0 with 8 warps a block that
// load all their weight vectors before griddepcontrol.wait (results/h200/gemv-run100,
// scripts/probes/gemv_grid_probe.cu): weights never depend on the kernel before. Inside the
// decode step a kernel is launched only when the one before triggers, and with the trigger after
// the wait fc had 1.6-1.8 us to load 8.4 MB (CUPTI's timeline, results/h200/trace-run106): the
// folded qkv and fc were slower wide. Triggering first, each wide kernel launches while the one
// before still waits, its weights are in registers when its input arrives, and the folded ones
// gain too: bloom-560m's step 0.574 -> 0.495 ms, gpt2's 0.221 -> 0.194 on an H200
// (results/h200/tf-run107).
// WIDE: K <= 1024 (kv <= 128): a block of 8 warps takes 8·CPW columns, a warp CPW of them
// (first, first + 8, …), each lane the vectors lane, lane + 32, lane + 64, lane + 96 of each
// row and of x (x once for all its columns: a warp holds the whole row, so a folded norm's
// statistics need no block reduction). ROW: 1024 < K <= 4096 (kv <= 512): two warps a column,
// four columns a block, each lane 8 vectors of its half of the row. A block a column (1024 blocks
// for bloom-560m's fc2) made qkv, the kernel after it, launch only 2 us ahead, once every one
// of those blocks was resident; a quarter of them, 3.8 us, and bloom-560m's step 0.485 -> 0.465
// ms, gpt2's 0.183 -> 0.178 on an H200 (results/h200/exp-run111).
constexpr int WIDE_WARPS = 8, WIDE_VPL = 4, ROW_WPC = 2, ROW_VPL = 8;

// W's vector i of row col as raw words (unpacked where used: held unpacked, each 16-bit element
// took a register), zeros past n or kv: the address clamped into W and the words masked (no
// branch before the wait; pdl.rs's WEIGHTS_FIRST test reads the PTX). A streaming load, not
// __ldg: ptxas moved every read-only (.nc) load of these kernels after griddepcontrol.wait, so
// 0bab297's weights never loaded early (the SASS, results/h200x2/gate-run108).
template <typename T>
__device__ __forceinline__ uint4 early_vec(const Vec16<T>* w, int col, int i, int n, int kv) {
  const bool in = col < n && i < kv;
  const uint4 u = __ldcs(reinterpret_cast<const uint4*>(w) + (in ? (long)col * kv + i : 0));
  const unsigned m = in ? ~0u : 0u;
  return make_uint4(u.x & m, u.y & m, u.z & m, u.w & m);
}

// x's vector i as raw words, zeros past kv.
template <typename T>
__device__ __forceinline__ uint4 x_words(const Vec16<T>* x, int i, int kv) {
  return i < kv ? *reinterpret_cast<const uint4*>(x + i) : make_uint4(0, 0, 0, 0);
}

// A word's two 16-bit elements.
template <typename T>
__device__ __forceinline__ float2 word_f(unsigned u);
template <>
__device__ __forceinline__ float2 word_f<__nv_bfloat16>(unsigned u) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u));
}
template <>
__device__ __forceinline__ float2 word_f<__half>(unsigned u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

// The dot product of two 16-byte vectors of T held as words.
template <typename T>
__device__ __forceinline__ float dot_words(const uint4& a, const uint4& b) {
  const unsigned aw[4] = {a.x, a.y, a.z, a.w}, bw[4] = {b.x, b.y, b.z, b.w};
  float s = 0.f;
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if constexpr (sizeof(T) == 4) {
      s += __uint_as_float(aw[j]) * __uint_as_float(bw[j]);
    } else {
      const float2 fa = word_f<T>(aw[j]), fb = word_f<T>(bw[j]);
      s += fa.x * fb.x + fa.y * fb.y;
    }
  }
  return s;
}

// Σ and Σ² of a 16-byte vector of T held as words, added to s1 and s2.
template <typename T>
__device__ __forceinline__ void sum_words(const uint4& b, float& s1, float& s2) {
  const unsigned bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    if constexpr (sizeof(T) == 4) {
      const float f = __uint_as_float(bw[j]);
      s1 += f;
      s2 += f * f;
    } else {
      const float2 f = word_f<T>(bw[j]);
      s1 += f.x + f.y;
      s2 += f.x * f.x + f.y * f.y;
    }
  }
}

// This lane's weight vectors of its CPW columns, then (after the wait) its vectors of x.
template <typename T, int CPW>
struct WideLoads {
  uint4 w[CPW][WIDE_VPL], x[WIDE_VPL];
  int first;  // the warp's first column
  __device__ __forceinline__ void weights(const Vec16<T>* wt, int n, int kv) {
    const int lane = threadIdx.x & 31;
    first = blockIdx.x * WIDE_WARPS * CPW + (threadIdx.x >> 5);
#pragma unroll
    for (int c = 0; c < CPW; c++)
#pragma unroll
      for (int v = 0; v < WIDE_VPL; v++) w[c][v] = early_vec(wt, first + c * WIDE_WARPS, v * 32 + lane, n, kv);
  }
  __device__ __forceinline__ void row_of_x(const Vec16<T>* xs, int kv) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int v = 0; v < WIDE_VPL; v++) x[v] = x_words(xs, v * 32 + lane, kv);
  }
  // Column c's dot product, complete in every lane.
  __device__ __forceinline__ float dot(int c) const {
    float a = 0.f;
#pragma unroll
    for (int v = 0; v < WIDE_VPL; v++) a += dot_words<T>(w[c][v], x[v]);
    return warp_sum(a);
  }
};

// y = act(x Wᵀ + b) [+ r] at one row, K <= 1024: gemv's tail (the residual rounded after the
// projection, as the add kernel), b never null.
template <typename T, int CPW>
__device__ void gemv_wide(const Vec16<T>* x, const Vec16<T>* w, const T* b, const T* r, T* y, int n, int kv,
                          int act) {
  WideLoads<T, CPW> l;
  pdl_trigger();
  l.weights(w, n, kv);
  pdl_wait();
  // Each column's bias and residual issued with x's loads, not after its dot product: loaded
  // after, each added a round trip to the kernel's end (results/h200/wide-run102, -run103).
  float bias[CPW], res[CPW];
#pragma unroll
  for (int c = 0; c < CPW; c++) {
    const int col = l.first + c * WIDE_WARPS;
    bias[c] = col < n ? to_f(b[col]) : 0.f;
    res[c] = r && col < n ? to_f(r[col]) : 0.f;
  }
  l.row_of_x(x, kv);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < CPW; c++) {
    const int col = l.first + c * WIDE_WARPS;
    float v = l.dot(c) + bias[c];
    if (act == 1) v = gelu_tanh(v);
    if (r) v = res[c] + to_f(from_f<T>(v));  // rounded before the add, as gemv's
    if (lane == 0 && col < n) y[col] = from_f<T>(v);
  }
}

// y = act(LN(x) Wᵀ + b) at one row, K <= 1024, the norm folded as in gemv_ln (sb, the same
// formula); the statistics from the warp's own copy of x.
template <typename T, int CPW>
__device__ void gemv_ln_wide(const Vec16<T>* x, const Vec16<T>* w, const float2* sb, T* y, int n, int kv, int act,
                             float eps) {
  WideLoads<T, CPW> l;
  pdl_trigger();
  l.weights(w, n, kv);
  pdl_wait();
  float2 fold[CPW];  // each column's (Σ W, bias), issued with x's loads
#pragma unroll
  for (int c = 0; c < CPW; c++) {
    const int col = l.first + c * WIDE_WARPS;
    fold[c] = col < n ? sb[col] : make_float2(0.f, 0.f);
  }
  l.row_of_x(x, kv);
  float s1 = 0.f, s2 = 0.f;
#pragma unroll
  for (int v = 0; v < WIDE_VPL; v++) sum_words<T>(l.x[v], s1, s2);
  const float inv_k = 1.f / (kv * (16 / (int)sizeof(T)));
  const float mean = warp_sum(s1) * inv_k;
  const float rstd = rsqrtf(fmaxf(warp_sum(s2) * inv_k - mean * mean, 0.f) + eps);
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < CPW; c++) {
    const int col = l.first + c * WIDE_WARPS;
    const float a = l.dot(c);
    if (lane != 0 || col >= n) continue;
    float v = rstd * (a - mean * fold[c].x) + fold[c].y;
    if (act == 1) v = gelu_tanh(v);
    y[col] = from_f<T>(v);
  }
}

// gemv_wide's tail for 1024 < K <= 4096: ROW_WPC warps a column, each a part of the row.
template <typename T>
__device__ void gemv_row(const Vec16<T>* x, const Vec16<T>* w, const T* b, const T* r, T* y, int n, int kv,
                         int act) {
  __shared__ float part[WIDE_WARPS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slice = warp % ROW_WPC;
  const int col = blockIdx.x * (WIDE_WARPS / ROW_WPC) + warp / ROW_WPC;
  uint4 wr[ROW_VPL];
  pdl_trigger();
#pragma unroll
  for (int v = 0; v < ROW_VPL; v++) wr[v] = early_vec(w, col, (slice * ROW_VPL + v) * 32 + lane, n, kv);
  pdl_wait();
  const bool finishes = slice == 0 && lane == 0 && col < n;  // its bias and residual loaded with x
  const float bias = finishes ? to_f(b[col]) : 0.f, res = finishes && r ? to_f(r[col]) : 0.f;
  float a = 0.f;
#pragma unroll
  for (int v = 0; v < ROW_VPL; v++) a += dot_words<T>(wr[v], x_words(x, (slice * ROW_VPL + v) * 32 + lane, kv));
  a = warp_sum(a);
  if (lane == 0) part[warp] = a;
  __syncthreads();
  if (!finishes) return;
  float v = bias;
#pragma unroll
  for (int k = 0; k < ROW_WPC; k++) v += part[warp + k];
  if (act == 1) v = gelu_tanh(v);
  if (r) v = res + to_f(from_f<T>(v));
  y[col] = from_f<T>(v);
}

#define WIDE_BLOCK __launch_bounds__(WIDE_WARPS * 32)
#define INSTANTIATE_WIDE_CPW(T, S, CPW)                                                                    \
  extern "C" __global__ void WIDE_BLOCK tb_wgemv##CPW##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, \
                                                            const T* r, T* y, int n, int kv, int act) {    \
    gemv_wide<T, CPW>(x, w, b, r, y, n, kv, act);                                                          \
  }                                                                                                        \
  extern "C" __global__ void WIDE_BLOCK tb_wgemv_ln##CPW##_##S(const Vec16<T>* x, const Vec16<T>* w,        \
                                                               const float2* sb, T* y, int n, int kv,     \
                                                               int act, float eps) {                       \
    gemv_ln_wide<T, CPW>(x, w, sb, y, n, kv, act, eps);                                                    \
  }
#define INSTANTIATE_WIDE(T, S)                                                                              \
  INSTANTIATE_WIDE_CPW(T, S, 1)                                                                             \
  INSTANTIATE_WIDE_CPW(T, S, 2) INSTANTIATE_WIDE_CPW(T, S, 3) INSTANTIATE_WIDE_CPW(T, S, 4) extern "C"       \
      __global__ void WIDE_BLOCK tb_wgemv_row_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, const T* r, \
                                                  T* y, int n, int kv, int act) {                          \
    gemv_row<T>(x, w, b, r, y, n, kv, act);                                                                \
  }
FOR_TYPES(INSTANTIATE_WIDE)
