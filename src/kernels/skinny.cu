// Decode projections and LM heads at 1-16 rows on tensor cores, launched by skinny.rs ("skinny"
// GEMM: M far smaller than N and K): y = act(x Wᵀ + b) for W (N, K) in nn.Linear's layout, its
// elements bf16 / f16 like x, or E4M3 with one f32 scale and bias a row (fp8.cu's weights:
// y = act(scale[n] · x q[n]ᵀ + bias[n])). One mma.sync m16n8k16 takes all 16 rows of x against
// an 8-column W tile, so W is read once, in 16-byte vectors.
//
// Shapes: x (M, K), W (N, K), y (M, N), contiguous; M <= 16; K a multiple of the slice (32
// elements, 64 for E4M3); any N (rows of W past N read as zeros). Block: WARPS warps, one
// COLS = 8 NT column tile of y; warp w takes every WARPS-th slice of K, U slices a round; the
// warps' sums meet in shared memory. Projections (PIPE): the next round's loads issued before
// this round's mmas; rounds of four slices at one tile, two at two tiles and for E4M3 (one
// slice of it). LM heads: each round loaded then multiplied. x is loaded in 16-byte vectors
// (until 62ebce1 nvcc split them into four 4-byte loads, and L1 was the busiest unit:
// results/h100/proj-prof69), except by the one-row head. With x in 4-byte loads the pipelined
// rounds of four lost everywhere (results/h100x2/skinny-run4) and four tiles beat two; with
// 16-byte loads (results/h100/knob-run73, knob-run74, 16 rows) rounds of four win at one tile
// (gpt2 -10 µs a step, bloom-560m -20; 116 registers), two tiles beat four for the wide 16-bit
// projections (bloom-560m -21 µs, gpt2 -6; four slices at two tiles: +50 µs, 158 registers),
// and the head at 2-16 rows takes four tiles in rounds of two (gpt2 -8 µs).
// Tiles: one for outputs below 2304 columns (a 1024-wide output over 128 blocks); two from
// 2304 (the qkv and the MLP's first projection of gpt2 and BLOOM); E4M3 four from 4096, which
// brings a quarter of the x a W byte brings at one (a lane's x loads are 4 / NT of its W
// bytes): fp8 bloom-7b1 at 16 rows 5.80 -> 4.82 ms against NT 2 (results/h100x2/skinny-run5).
// `--fused skinny-fold` (models/norm_fold.rs at 5-16 rows): the residual add in the epilogue
// (r, rounded as the add kernel rounds), and the projection after a LayerNorm folded into W
// (FOLD: each lane sums Σ x and Σ x² of the x vectors it loads for the mmas, every element of
// x once a block; the warps' sums meet in shared memory with the products), so that a block's
// add + norm kernels go.
//
// The order of k inside a slice is free (a dot product), and is chosen so that every operand is
// one 16-byte load a lane: lane (g, t) = (lane / 4, lane % 4) holds elements E t .. E t + E - 1
// of its x rows (g, g + 8) and of its W row (E = 8, or 16 for E4M3), and mma j takes elements
// 4j..4j+3 of them as the fragment's k = 2t, 2t+1 (4j, 4j+1) and 2t+8, 2t+9 (4j+2, 4j+3).
#include "common.cuh"
#include <cuda_fp8.h>

constexpr int WARPS = 8;

struct Words { uint32_t w[4]; };  // a 16-byte vector as four pairs of 16-bit elements

// W is read once: streamed past L1, which keeps x.
__device__ __forceinline__ Words stream(const Words* p) {
  const uint4 v = __ldcs((const uint4*)p);
  return {{v.x, v.y, v.z, v.w}};
}

// x in one 16-byte load: copied as a Words (4-byte aligned) nvcc loaded it as four 4-byte
// loads, each a request of 16 sectors, so that x cost four L1 requests a vector
// (results/h100/proj-prof69: L1/TEX the busiest unit, 2 / 3 of its sectors hits).
__device__ __forceinline__ Words fetch(const Words* p) {
  const uint4 v = *(const uint4*)p;
  return {{v.x, v.y, v.z, v.w}};
}

template <typename T> __device__ void mma(float* c, const uint32_t* a, uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma<__nv_bfloat16>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma<__half>(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two E4M3 values (the low byte first) as a pair of T, exactly: E4M3 fits f16 and bf16.
template <typename T> __device__ uint32_t pair_of(uint32_t two);
template <> __device__ __forceinline__ uint32_t pair_of<__half>(uint32_t two) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
  return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
template <> __device__ __forceinline__ uint32_t pair_of<__nv_bfloat16>(uint32_t two) {
  const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3)));
  const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *(const uint32_t*)&b;
}

// One round's operands of a lane: U slices of its two x rows (XW vectors a slice: 1, or 2 for
// E4M3 weights) and of its NT W rows (a vector a slice).
template <int NT, int XW, int U> struct Round { Words xa[U][XW], xb[U][XW], w[U][NT]; };

// Two 16-bit elements of T as floats.
template <typename T> __device__ float2 pair_f(uint32_t two);
template <> __device__ __forceinline__ float2 pair_f<__nv_bfloat16>(uint32_t two) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&two));
}
template <> __device__ __forceinline__ float2 pair_f<__half>(uint32_t two) {
  return __half22float2(*reinterpret_cast<const __half2*>(&two));
}

// FOLD: adds a round's x elements of the lane's two rows into s = (Σ x, Σ x² of row g, the
// same of row g + 8); slices past K and rows past M were loaded as zeros and add nothing.
template <typename T, int NT, int U>
__device__ __forceinline__ void add_stats(float4& s, const Round<NT, 1, U>& r) {
#pragma unroll
  for (int u = 0; u < U; u++)
#pragma unroll
    for (int q = 0; q < 4; q++) {
      const float2 a = pair_f<T>(r.xa[u][0].w[q]), b = pair_f<T>(r.xb[u][0].w[q]);
      s.x += a.x + a.y;
      s.y = fmaf(a.x, a.x, fmaf(a.y, a.y, s.y));
      s.z += b.x + b.y;
      s.w = fmaf(b.x, b.x, fmaf(b.y, b.y, s.w));
    }
}

// Loads round s0 (slices s0, s0 + WARPS, ...); zeros past K, M and N. WIDE: x in 16-byte loads;
// else 4-byte ones (the one-row head: with 16-byte ones nvcc put a round's first mma before its
// last loads, and gpt2's batch-1 step took 8 µs more, results/h100x2/fetch-run70).
template <bool WIDE, int NT, int XW, int U>
__device__ __forceinline__ void load(Round<NT, XW, U>& r, const Words* x, const Words* w, int s0, int slices, int m, int n,
                                     int xv, int wv) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3, n0 = blockIdx.x * 8 * NT;
  const Words zero = {{0, 0, 0, 0}};
#pragma unroll
  for (int u = 0; u < U; u++) {
    const int s = s0 + u * WARPS;
    const bool live = s < slices;
#pragma unroll
    for (int v = 0; v < XW; v++) {  // x row g, vectors (slice s, lane t)
      const long at = (long)s * 4 * XW + t * XW + v;
      if constexpr (WIDE) {
        r.xa[u][v] = live && g < m ? fetch(&x[(long)g * xv + at]) : zero;
        r.xb[u][v] = live && g + 8 < m ? fetch(&x[(long)(g + 8) * xv + at]) : zero;
      } else {
        r.xa[u][v] = live && g < m ? x[(long)g * xv + at] : zero;
        r.xb[u][v] = live && g + 8 < m ? x[(long)(g + 8) * xv + at] : zero;
      }
    }
#pragma unroll
    for (int i = 0; i < NT; i++) {  // W row n0 + 8i + g, vector (slice s, lane t)
      const int col = n0 + 8 * i + g;
      r.w[u][i] = live && col < n ? stream(&w[(long)col * wv + s * 4 + t]) : zero;
    }
  }
}

template <typename T, int NT, int XW, int U>
__device__ __forceinline__ void multiply(float (*c)[4], const Round<NT, XW, U>& r, int s0, int slices) {
#pragma unroll
  for (int u = 0; u < U; u++) {
    if (s0 + u * WARPS >= slices) break;  // the same for the whole warp
#pragma unroll
    for (int i = 0; i < NT; i++) {
      uint32_t b[4 * XW];  // W's pairs, in element order
#pragma unroll
      for (int p = 0; p < 4 * XW; p++) {
        if constexpr (XW == 2) b[p] = pair_of<T>(r.w[u][i].w[p / 2] >> (16 * (p % 2)));
        else b[p] = r.w[u][i].w[p];
      }
#pragma unroll
      for (int j = 0; j < 2 * XW; j++) {
        const int v = j / 2, q = 2 * (j % 2);
        const uint32_t a[4] = {r.xa[u][v].w[q], r.xb[u][v].w[q], r.xa[u][v].w[q + 1], r.xb[u][v].w[q + 1]};
        mma<T>(c[i], a, b[2 * j], b[2 * j + 1]);
      }
    }
  }
}

// y = act(scale · x Wᵀ + bias) [+ r]: sb[n] = (scale, bias) for E4M3, else (1, b[n] or 0).
// FOLD: y = act(rstd·(x Wᵀ − mean·Σ W) + b') [+ r] with sb[n] = (Σₖ W[n, k], b'[n]) (W and b'
// the projection with the norm folded in, norm_fold.rs), mean and rstd each row's from x.
// r (M, N) may be null. U16: slices a round of 16-bit W (half as many of E4M3: the same x
// bytes a round).
template <typename T, typename W, int NT, int U16, bool PIPE, bool FOLD = false, bool WIDE = true>
__device__ void skinny(const T* x, const W* w, const T* b, const float2* sb, const T* r, T* y, int m, int n, int k,
                       int act, float eps = 0.f) {
  constexpr bool FP8 = sizeof(W) == 1;
  constexpr int XW = FP8 ? 2 : 1, U = FP8 ? (U16 + 1) / 2 : U16, COLS = 8 * NT;
  static_assert(!FOLD || (PIPE && !FP8), "a folded norm over 16-bit weights");
  __shared__ float part[WARPS][16][COLS];
  __shared__ float2 stat[FOLD ? WARPS : 1][16];  // FOLD: each warp's (Σ x, Σ x²) of a row
  float4 st = make_float4(0.f, 0.f, 0.f, 0.f);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * COLS, slices = k / (32 * XW);
  const int xv = k * (int)sizeof(T) / 16, wv = k * (int)sizeof(W) / 16;  // vectors a row
  float c[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
  const Words *xw = (const Words*)x, *ww = (const Words*)w;
  if constexpr (PIPE) {
    Round<NT, XW, U> cur;
    load<WIDE>(cur, xw, ww, warp, slices, m, n, xv, wv);
    for (int s0 = warp; s0 < slices; s0 += WARPS * U) {
      Round<NT, XW, U> next;
      load<WIDE>(next, xw, ww, s0 + WARPS * U, slices, m, n, xv, wv);
      multiply<T>(c, cur, s0, slices);
      if constexpr (FOLD) add_stats<T>(st, cur);
      cur = next;
    }
  } else {
    for (int s0 = warp; s0 < slices; s0 += WARPS * U) {
      Round<NT, XW, U> cur;
      load<WIDE>(cur, xw, ww, s0, slices, m, n, xv, wv);
      multiply<T>(c, cur, s0, slices);
    }
  }
  // Accumulator of lane (g, t): rows g and g + 8, columns 2t and 2t + 1 of each tile.
#pragma unroll
  for (int i = 0; i < NT; i++) {
    part[warp][g][8 * i + 2 * t] = c[i][0];
    part[warp][g][8 * i + 2 * t + 1] = c[i][1];
    part[warp][g + 8][8 * i + 2 * t] = c[i][2];
    part[warp][g + 8][8 * i + 2 * t + 1] = c[i][3];
  }
  if constexpr (FOLD) {  // the lanes t of a row g summed, then the warps in the epilogue
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      st.x += __shfl_xor_sync(0xffffffffu, st.x, o);
      st.y += __shfl_xor_sync(0xffffffffu, st.y, o);
      st.z += __shfl_xor_sync(0xffffffffu, st.z, o);
      st.w += __shfl_xor_sync(0xffffffffu, st.w, o);
    }
    if (t == 0) {
      stat[warp][g] = make_float2(st.x, st.y);
      stat[warp][g + 8] = make_float2(st.z, st.w);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < m * COLS; e += blockDim.x) {
    const int row = e / COLS, col = n0 + e % COLS;
    if (col >= n) continue;
    float v = 0.f;
#pragma unroll
    for (int s = 0; s < WARPS; s++) v += part[s][row][e % COLS];
    const float2 f = FP8 || FOLD ? sb[col] : make_float2(1.f, b ? to_f(b[col]) : 0.f);
    if constexpr (FOLD) {  // as gemv.cu's gemv_ln: one-pass statistics in f32
      float s1 = 0.f, s2 = 0.f;
#pragma unroll
      for (int s = 0; s < WARPS; s++) {
        s1 += stat[s][row].x;
        s2 += stat[s][row].y;
      }
      const float inv_k = 1.f / k, mean = s1 * inv_k, var = fmaxf(s2 * inv_k - mean * mean, 0.f);
      v = rsqrtf(var + eps) * (v - mean * f.x) + f.y;
    } else {
      v = v * f.x + f.y;
    }
    if (act == 1) v = gelu_tanh(v);
    // Rounded before the add, as the branch's output was before the add kernel.
    if (r) v = to_f(r[(long)row * n + col]) + to_f(from_f<T>(v));
    y[(long)row * n + col] = from_f<T>(v);
  }
}

// b: the bias (N,), or null; r: the residual (M, N), or null; act: 0 none, 1 GELU (tanh
// approximation). tb_skinny_ln: sb (N, 2) f32, the folded projection's (Σ W, bias). U: slices a
// round (six and eight at one tile gained less than four, knob-run73).
#define SKINNY(T, S, NT, U)                                                                            \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) tb_skinny##NT##_##S(                        \
      const T* x, const T* w, const T* b, const T* r, T* y, int m, int n, int k, int act) {            \
    pdl_begin();                                                                                       \
    skinny<T, T, NT, U, true>(x, w, b, nullptr, r, y, m, n, k, act);                                   \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) tb_skinny_ln##NT##_##S(                     \
      const T* x, const T* w, const float2* sb, T* y, int m, int n, int k, int act, float eps) {       \
    pdl_begin();                                                                                       \
    skinny<T, T, NT, U, true, true>(x, w, nullptr, sb, nullptr, y, m, n, k, act, eps);                 \
  }
#define SKINNY_FP8(T, S, NT)                                                                           \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) tb_skinny_fp8_##NT##_##S(                   \
      const T* x, const uint8_t* q, const float2* sb, T* y, int m, int n, int k, int act) {            \
    pdl_begin();                                                                                       \
    skinny<T, uint8_t, NT, 2, true>(x, q, nullptr, sb, nullptr, y, m, n, k, act);                      \
  }
// tb_skinny_head: two tiles, rounds of four slices, x in 4-byte loads (one row: with 16-byte
// ones gpt2's step +8 µs, results/h100x2/fetch-run70); tb_skinny_head_wide: 2-16 rows.
#define SKINNY_HEAD(T, S)                                                                              \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) tb_skinny_head_##S(const T* x, const T* w, T* y, \
                                                                             int m, int n, int k) {    \
    pdl_begin();                                                                                       \
    skinny<T, T, 2, 4, false, false, false>(x, w, nullptr, nullptr, nullptr, y, m, n, k, 0);           \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) tb_skinny_head_wide_##S(                    \
      const T* x, const T* w, T* y, int m, int n, int k) {                                             \
    pdl_begin();                                                                                       \
    skinny<T, T, 4, 2, false>(x, w, nullptr, nullptr, nullptr, y, m, n, k, 0);                         \
  }
SKINNY(__nv_bfloat16, bf16, 1, 4)
SKINNY(__nv_bfloat16, bf16, 2, 2)
SKINNY(__half, f16, 1, 4)
SKINNY(__half, f16, 2, 2)
SKINNY_FP8(__nv_bfloat16, bf16, 1)
SKINNY_FP8(__nv_bfloat16, bf16, 4)
SKINNY_FP8(__half, f16, 1)
SKINNY_FP8(__half, f16, 4)
SKINNY_HEAD(__nv_bfloat16, bf16)
SKINNY_HEAD(__half, f16)
