// fp8 weights on Hopper (#37 item 3, `--dtype fp8`), launched by fp8.rs: W stored as E4M3 with
// one f32 scale per output row (W ≈ scale[n] · q[n, :]), activations and sums in bf16 / f16 / f32.
// Shapes: q (N, K) bytes, K a multiple of 16 (KQ 16-byte vectors a row); x (M, K); y (M, N).
#include "common.cuh"
#include <cuda_fp8.h>

// 16 E4M3 values (one 16-byte load, element j at byte j) to f32, two at a time (cvt e4m3x2 on
// sm_89+: the low byte of each pair is the first element).
__device__ __forceinline__ void fp8x16_to_f(const uint4 v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; i++) {
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const __nv_fp8x2_storage_t pair = (w[i] >> (16 * h)) & 0xffff;
      const float2 p = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(pair, __NV_E4M3)));
      f[4 * i + 2 * h] = p.x;
      f[4 * i + 2 * h + 1] = p.y;
    }
  }
}

// Decode projections at 1-4 rows: y = act(scale[n] · (x q[n]ᵀ) + bias[n]), sb (N, 2) f32 holding
// scale and bias. A block: COLS columns, SPLIT warps over K; each lane loads its x vectors once
// and the COLS columns' weight vectors beside them (COLS loads in flight a step: with one column
// a warp, bloom-7b1's K = 4096 rows left a lane two loads and the step at 2.1 TB/s,
// results/h100/fp8-run1). The warps' sums meet in shared memory. SPLIT: 4, or 8 for one row
// whose K gives each lane of 8 warps a vector a column (bloom-7b1's step 3.063 → 2.988 ms,
// results/h100x2/fp8-sweep1; not tried at 2–4 rows, whose 96–162 registers a thread would
// leave 256-thread blocks one to two an SM).
constexpr int COLS = 4;

// acc[c][m] += row m of x · column c's weight vector wv[c], at the vector i of q's rows.
template <typename T, int M>
__device__ __forceinline__ void fp8_dot(const uint4 (&wv)[COLS], const Vec16<T>* x, int kq, int i,
                                        float (&acc)[COLS][M]) {
  constexpr int XV = sizeof(T);  // x vectors a weight vector: 16 values, 2 (bf16 / f16)
  constexpr int E = 16 / sizeof(T);
  float xf[M][16];
#pragma unroll
  for (int m = 0; m < M; m++)
#pragma unroll
    for (int v = 0; v < XV; v++) {
      const Vec16<T> xv = x[((long)m * kq + i) * XV + v];
#pragma unroll
      for (int j = 0; j < E; j++) xf[m][v * E + j] = to_f(xv.e[j]);
    }
#pragma unroll
  for (int c = 0; c < COLS; c++) {
    float wf[16];
    fp8x16_to_f(wv[c], wf);
#pragma unroll
    for (int m = 0; m < M; m++)
#pragma unroll
      for (int j = 0; j < 16; j++) acc[c][m] += wf[j] * xf[m][j];
  }
}

// EARLY (`--fused early-weights`, the tb_early_gemv_fp8* kernels): a lane's first COLS weight
// vectors loaded before the kernel's pdl_begin(), at clamped in-range addresses (no branch
// before the wait; only q is read early, a weight no decode step writes).
template <typename T, int M, int SPLIT, bool EARLY = false>
__device__ void gemv_fp8(const Vec16<T>* x, const uint4* q, const float2* sb, T* y, int n, int kq,
                         int act) {
  __shared__ float part[SPLIT][COLS][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, col0 = blockIdx.x * COLS;
  const uint4* rows[COLS];
#pragma unroll
  for (int c = 0; c < COLS; c++) rows[c] = q + (long)min(col0 + c, n - 1) * kq;  // past n: discarded
  float acc[COLS][M];
#pragma unroll
  for (int c = 0; c < COLS; c++)
#pragma unroll
    for (int m = 0; m < M; m++) acc[c][m] = 0.f;
  int i = warp * 32 + lane;
  if constexpr (EARLY) {
    uint4 wv[COLS];
#pragma unroll
    for (int c = 0; c < COLS; c++) wv[c] = __ldcs(rows[c] + min(i, kq - 1));
    pdl_begin();
    if (i < kq) fp8_dot<T, M>(wv, x, kq, i, acc);
    i += 32 * SPLIT;
  }
#pragma unroll 2
  for (; i < kq; i += 32 * SPLIT) {
    uint4 wv[COLS];
#pragma unroll
    for (int c = 0; c < COLS; c++) wv[c] = __ldcs(rows[c] + i);  // streamed: x keeps L1
    fp8_dot<T, M>(wv, x, kq, i, acc);
  }
#pragma unroll
  for (int c = 0; c < COLS; c++)
#pragma unroll
    for (int m = 0; m < M; m++) {
      const float v = warp_sum(acc[c][m]);
      if (lane == 0) part[warp][c][m] = v;
    }
  __syncthreads();
  // Thread t < COLS·M finishes column t / M, row t % M: the warps' sums, the scale, the bias.
  const int c = threadIdx.x / M, m = threadIdx.x % M, col = col0 + c;
  if (threadIdx.x >= COLS * M || col >= n) return;
  float v = 0.f;
#pragma unroll
  for (int s = 0; s < SPLIT; s++) v += part[s][c][m];
  const float2 a = sb[col];
  v = v * a.x + a.y;
  if (act == 1) v = gelu_tanh(v);
  y[(long)m * n + col] = from_f<T>(v);
}

// W back to the activations' type for the rows the GEMV does not take (prefill, scoring, more
// than 4 rows): out[n, k] = scale[n] · q[n, k], one 16-byte vector of q a thread.
template <typename T>
__device__ void dequant(const uint4* q, const float2* sb, Vec16<T>* out, int kq, long vectors) {
  constexpr int E = 16 / sizeof(T), XV = 16 / E;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < vectors;
       i += (long)gridDim.x * blockDim.x) {
    const float s = sb[i / kq].x;
    float wf[16];
    fp8x16_to_f(q[i], wf);
#pragma unroll
    for (int v = 0; v < XV; v++) {
      Vec16<T> o;
#pragma unroll
      for (int j = 0; j < E; j++) o.e[j] = from_f<T>(wf[v * E + j] * s);
      out[i * XV + v] = o;
    }
  }
}

// Quantization, a block a row: scale = max(|w|, 1e-12) / 448, q = E4M3(w / scale) rounded to
// nearest even, saturated (as the CPU's float8 crate, so both hold the same bytes). candle's own
// CUDA cast to E4M3 looks up a kernel name its PTX does not have (candle 0.11.1).
template <typename T>
__device__ void quantize(const T* w, __nv_fp8_storage_t* q, float* scale, int k) {
  __shared__ float sh[32];
  const T* row = w + (long)blockIdx.x * k;
  __nv_fp8_storage_t* out = q + (long)blockIdx.x * k;
  float m = 0.f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) m = fmaxf(m, fabsf(to_f(row[i])));
  const float s = fmaxf(block_max(m, sh), 1e-12f) / 448.f;
  for (int i = threadIdx.x; i < k; i += blockDim.x) {
    const float v = fminf(fmaxf(to_f(row[i]) / s, -448.f), 448.f);
    out[i] = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
  }
  if (threadIdx.x == 0) scale[blockIdx.x] = s;
}

#define INSTANTIATE_M(T, S, M)                                                                 \
  extern "C" __global__ void tb_gemv_fp8_##M##_##S(const Vec16<T>* x, const uint4* q,          \
                                                   const float2* sb, T* y, int n, int kq,      \
                                                   int act) {                                  \
    pdl_begin();                                                                               \
    gemv_fp8<T, M, 4>(x, q, sb, y, n, kq, act);                                                \
  }                                                                                            \
  extern "C" __global__ void tb_early_gemv_fp8_##M##_##S(const Vec16<T>* x, const uint4* q,    \
                                                         const float2* sb, T* y, int n, int kq, \
                                                         int act) {                            \
    gemv_fp8<T, M, 4, true>(x, q, sb, y, n, kq, act);                                          \
  }
#define INSTANTIATE(T, S)                                                                      \
  INSTANTIATE_M(T, S, 1) INSTANTIATE_M(T, S, 2) INSTANTIATE_M(T, S, 3) INSTANTIATE_M(T, S, 4)  \
  extern "C" __global__ void tb_gemv_fp8_1w8_##S(const Vec16<T>* x, const uint4* q,            \
                                                 const float2* sb, T* y, int n, int kq, int act) { \
    pdl_begin();                                                                               \
    gemv_fp8<T, 1, 8>(x, q, sb, y, n, kq, act);                                                \
  }                                                                                            \
  extern "C" __global__ void tb_early_gemv_fp8_1w8_##S(const Vec16<T>* x, const uint4* q,      \
                                                       const float2* sb, T* y, int n, int kq,  \
                                                       int act) {                              \
    gemv_fp8<T, 1, 8, true>(x, q, sb, y, n, kq, act);                                          \
  }                                                                                            \
  extern "C" __global__ void tb_fp8_dequant_##S(const uint4* q, const float2* sb, Vec16<T>* out, \
                                                int kq, long vectors) {                        \
    dequant<T>(q, sb, out, kq, vectors);                                                       \
  }                                                                                            \
  extern "C" __global__ void tb_fp8_quantize_##S(const T* w, __nv_fp8_storage_t* q,           \
                                                 float* scale, int k) {                        \
    quantize<T>(w, q, scale, k);                                                               \
  }
FOR_TYPES(INSTANTIATE)
