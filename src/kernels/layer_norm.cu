// LayerNorm: training's (#10), one kernel forward and one backward where the row is whole
// 16-byte vectors (the _vec kernels), else one forward and two backward; generation's (#20),
// the residual add and the LayerNorm in one pass. Launched by layer_norm.rs.
// Shapes: x, y, dy, dx, res, r, s (rows, C) storage type T, w and b (C,); part (⌈rows/LN_ROWS⌉, 2, C)
// f32 (⌈rows/LN_BWD_ROWS⌉ from layer_norm_bwd_vec, 3 rows with its Σ res).
#include "common.cuh"

// LayerNorm over the last dim C of (rows, C), statistics in f32: y = (x − μ)·rstd·w + b with
// rstd = 1/√(σ² + ε) (biased σ², as torch). One warp per row; the row stays in L1 between
// the passes. candle's differentiable layer_norm_slow is ~10 ops with casts each way; this is
// one kernel forward and two backward (dx; the dw/db partial sums).
template <typename T>
__device__ __forceinline__ void ln_stats(const T* xr, int c, float eps, float& mean, float& rstd) {
  const int lane = threadIdx.x & 31;
  float s = 0.f;
  for (int j = lane; j < c; j += 32) s += to_f(xr[j]);
  mean = warp_sum(s) / c;
  float v = 0.f;
  for (int j = lane; j < c; j += 32) {
    const float d = to_f(xr[j]) - mean;
    v += d * d;
  }
  rstd = 1.f / sqrtf(warp_sum(v) / c + eps);
}
template <typename T>
__device__ void layer_norm_fwd(const T* x, const T* w, const T* b, T* y, long rows, int c, float eps) {
  const long row = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * c;
  float mean, rstd;
  ln_stats(xr, c, eps, mean, rstd);
  for (int j = lane; j < c; j += 32) y[row * c + j] = from_f<T>((to_f(xr[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
}
// The mean and 1/√(σ² + ε) of a row held as V 16-byte vectors a lane of one warp (vectors
// lane + 32·k below nv), summed in the same order in the forward and the backward.
template <typename T, int V>
__device__ __forceinline__ void vec_row_stats(const Vec16<T> (&xv)[V], int lane, int nv, int c, float eps,
                                              float& mean, float& rstd) {
  constexpr int E = 16 / sizeof(T);
  float s = 0.f;
#pragma unroll
  for (int k = 0; k < V; k++)
    if (lane + 32 * k < nv)
#pragma unroll
      for (int e = 0; e < E; e++) s += to_f(xv[k].e[e]);
  mean = warp_sum(s) / c;
  float var = 0.f;
#pragma unroll
  for (int k = 0; k < V; k++)
    if (lane + 32 * k < nv)
#pragma unroll
      for (int e = 0; e < E; e++) {
        const float d = to_f(xv[k].e[e]) - mean;
        var += d * d;
      }
  rstd = 1.f / sqrtf(warp_sum(var) / c + eps);
}

// The forward with 16-byte vectors, the row in registers (read once, not three times through
// L1 as above): V vectors a lane, C a multiple of the vector (layer_norm_bwd_vec's V).
template <typename T, int V>
__device__ void layer_norm_fwd_vec(const T* x, const T* w, const T* b, T* y, long rows, int c, float eps) {
  constexpr int E = 16 / sizeof(T);
  const long row = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31, nv = c / E;
  const Vec16<T>* xr = reinterpret_cast<const Vec16<T>*>(x + row * c);
  Vec16<T> xv[V];
#pragma unroll
  for (int k = 0; k < V; k++)
    if (lane + 32 * k < nv) xv[k] = xr[lane + 32 * k];
  float mean, rstd;
  vec_row_stats<T, V>(xv, lane, nv, c, eps, mean, rstd);
  Vec16<T>* yr = reinterpret_cast<Vec16<T>*>(y + row * c);
#pragma unroll
  for (int k = 0; k < V; k++)
    if (lane + 32 * k < nv) {
      const Vec16<T> wv = reinterpret_cast<const Vec16<T>*>(w)[lane + 32 * k];
      const Vec16<T> bv = reinterpret_cast<const Vec16<T>*>(b)[lane + 32 * k];
      Vec16<T> o;
#pragma unroll
      for (int e = 0; e < E; e++)
        o.e[e] = from_f<T>((to_f(xv[k].e[e]) - mean) * rstd * to_f(wv.e[e]) + to_f(bv.e[e]));
      yr[lane + 32 * k] = o;
    }
}

// dx = rstd · (g − mean(g) − x̂ · mean(g ⊙ x̂)),  g = dy ⊙ w, x̂ = (x − μ)·rstd.
template <typename T>
__device__ void layer_norm_bwd_x(const T* x, const T* w, const T* dy, T* dx, long rows, int c, float eps) {
  const long row = blockIdx.x * (long)(blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  const T* xr = x + row * c;
  const T* gr = dy + row * c;
  float mean, rstd;
  ln_stats(xr, c, eps, mean, rstd);
  float sg = 0.f, sgx = 0.f;
  for (int j = lane; j < c; j += 32) {
    const float g = to_f(gr[j]) * to_f(w[j]);
    sg += g;
    sgx += g * (to_f(xr[j]) - mean) * rstd;
  }
  sg = warp_sum(sg) / c;
  sgx = warp_sum(sgx) / c;
  for (int j = lane; j < c; j += 32) {
    const float g = to_f(gr[j]) * to_f(w[j]), xh = (to_f(xr[j]) - mean) * rstd;
    dx[row * c + j] = from_f<T>(rstd * (g - sg - xh * sgx));
  }
}
// Partial column sums for dw = Σ dy ⊙ x̂ and db = Σ dy over LN_ROWS rows per block:
// part (gridDim.x, 2, C) f32, summed over blocks afterwards. Shared: 2·LN_ROWS floats.
#define LN_ROWS 16
template <typename T>
__device__ void layer_norm_bwd_wb(const T* x, const T* dy, float* part, long rows, int c, float eps) {
  __shared__ float stats[2 * LN_ROWS];
  const long r0 = blockIdx.x * (long)LN_ROWS;
  const int nr = (int)min((long)LN_ROWS, rows - r0);
  for (int r = threadIdx.x >> 5; r < nr; r += blockDim.x >> 5) {
    float mean, rstd;
    ln_stats(x + (r0 + r) * c, c, eps, mean, rstd);
    if ((threadIdx.x & 31) == 0) {
      stats[2 * r] = mean;
      stats[2 * r + 1] = rstd;
    }
  }
  __syncthreads();
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    float dw = 0.f, db = 0.f;
    for (int r = 0; r < nr; ++r) {
      const long i = (r0 + r) * c + j;
      const float g = to_f(dy[i]);
      dw += g * (to_f(x[i]) - stats[2 * r]) * stats[2 * r + 1];
      db += g;
    }
    part[(long)blockIdx.x * 2 * c + j] = dw;
    part[(long)blockIdx.x * 2 * c + c + j] = db;
  }
}

// The backward in one pass, 16-byte vectors, a warp a row held in registers: dx as
// layer_norm_bwd_x and the dw / db partial sums as layer_norm_bwd_wb, LN_BWD_ROWS rows a block
// (its warps' sums added in warp order: a fixed order). x and dy are read once instead of once
// for dx and again for the partials, each with its statistics (train-prof2: the two kernels
// at ≈ 1.4 TB/s). V: vectors a lane, ⌈C / (32·E)⌉; C a multiple of E, at most LN_BWD_MAXC.
// With res set, dx = res + the LayerNorm's dx (that rounded to T first, as the composed add):
// the residual stream's gradient, without an add kernel that reads both back (#36); with
// rsum too, Σ_rows res as a third row of the partials (a projection's bias gradient, without
// a column sum that reads res again), each warp's sums in its own C floats of shared memory.
// Dynamic shared memory: 2·C floats, 8·C with rsum.
#define LN_BWD_ROWS 32
#define LN_BWD_WARPS 8
#define LN_BWD_MAXC 2048
template <typename T, int V>
__device__ void layer_norm_bwd_vec(const T* x, const T* w, const T* dy, const T* res, int rsum, T* dx, float* part,
                                   long rows, int c, float eps) {
  constexpr int E = 16 / sizeof(T);
  extern __shared__ float sh[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nv = c / E;
  const long r0 = blockIdx.x * (long)LN_BWD_ROWS;
  const int parts = rsum ? 3 : 2;
  float* res_sums = sh + warp * c;  // this warp's Σ res (rsum)
  float dwa[V][E], dba[V][E];
  Vec16<T> wv[V];
#pragma unroll
  for (int k = 0; k < V; k++) {
#pragma unroll
    for (int e = 0; e < E; e++) dwa[k][e] = dba[k][e] = 0.f;
    if (lane + 32 * k < nv) wv[k] = reinterpret_cast<const Vec16<T>*>(w)[lane + 32 * k];
    if (rsum && lane + 32 * k < nv)
#pragma unroll
      for (int e = 0; e < E; e++) res_sums[(lane + 32 * k) * E + e] = 0.f;
  }
  for (int rr = warp; rr < LN_BWD_ROWS && r0 + rr < rows; rr += LN_BWD_WARPS) {
    const Vec16<T>* xr = reinterpret_cast<const Vec16<T>*>(x + (r0 + rr) * c);
    const Vec16<T>* gr = reinterpret_cast<const Vec16<T>*>(dy + (r0 + rr) * c);
    // The residual's row is loaded with x and dy (one memory latency a row, not a second one
    // after the reductions) where its registers fit (32 elements a lane: bf16 V ≤ 4, f32 V ≤
    // 8; more spilled), else asked into L1 now and loaded at the end.
    constexpr bool early = V * E <= 32;
    const Vec16<T>* rs = reinterpret_cast<const Vec16<T>*>(res + (r0 + rr) * c);
    Vec16<T> xv[V], gv[V], rv[early ? V : 1];
#pragma unroll
    for (int k = 0; k < V; k++)
      if (lane + 32 * k < nv) {
        xv[k] = xr[lane + 32 * k];
        gv[k] = gr[lane + 32 * k];
        if (res && early) rv[k] = rs[lane + 32 * k];
        if (res && !early) asm volatile("prefetch.global.L1 [%0];" ::"l"(rs + lane + 32 * k));
      }
    float mean, rstd;
    vec_row_stats<T, V>(xv, lane, nv, c, eps, mean, rstd);
    float sg = 0.f, sgx = 0.f;
#pragma unroll
    for (int k = 0; k < V; k++)
      if (lane + 32 * k < nv)
#pragma unroll
        for (int e = 0; e < E; e++) {
          const float dyj = to_f(gv[k].e[e]), g = dyj * to_f(wv[k].e[e]);
          const float xh = (to_f(xv[k].e[e]) - mean) * rstd;
          sg += g;
          sgx += g * xh;
          dwa[k][e] += dyj * xh;
          dba[k][e] += dyj;
        }
    sg = warp_sum(sg) / c;
    sgx = warp_sum(sgx) / c;
    Vec16<T>* dr = reinterpret_cast<Vec16<T>*>(dx + (r0 + rr) * c);
#pragma unroll
    for (int k = 0; k < V; k++)
      if (lane + 32 * k < nv) {
        Vec16<T> o;
#pragma unroll
        for (int e = 0; e < E; e++) {
          const float g = to_f(gv[k].e[e]) * to_f(wv[k].e[e]), xh = (to_f(xv[k].e[e]) - mean) * rstd;
          o.e[e] = from_f<T>(rstd * (g - sg - xh * sgx));
        }
        // __fadd_rn: never contracted with the product above into an FMA (f32: the composed
        // add rounds dx first).
        if (res) {
          const Vec16<T> r = early ? rv[early ? k : 0] : rs[lane + 32 * k];
#pragma unroll
          for (int e = 0; e < E; e++) o.e[e] = from_f<T>(__fadd_rn(to_f(r.e[e]), to_f(o.e[e])));
          if (rsum)
#pragma unroll
            for (int e = 0; e < E; e++) res_sums[(lane + 32 * k) * E + e] += to_f(r.e[e]);
        }
        dr[lane + 32 * k] = o;
      }
  }
  float* out = part + (long)blockIdx.x * parts * c;
  if (rsum) {  // Σ res of the block, the warps' sums added warp 0 first
    __syncthreads();
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float t = 0.f;
      for (int wi = 0; wi < LN_BWD_WARPS; wi++) t += sh[wi * c + j];
      out[2 * c + j] = t;
    }
    __syncthreads();
  }
  // The warps' partials into (dw, db) of the block, warp 0 first: part (gridDim.x, parts, C).
  for (int wi = 0; wi < LN_BWD_WARPS; wi++) {
    if (warp == wi)
#pragma unroll
      for (int k = 0; k < V; k++)
        if (lane + 32 * k < nv)
#pragma unroll
          for (int e = 0; e < E; e++) {
            const int j = (lane + 32 * k) * E + e;
            sh[j] = (wi ? sh[j] : 0.f) + dwa[k][e];
            sh[c + j] = (wi ? sh[c + j] : 0.f) + dba[k][e];
          }
    __syncthreads();
  }
  for (int j = threadIdx.x; j < 2 * c; j += blockDim.x) out[j] = sh[j];
}

// Generation (`--fused decode`): the residual add and the next LayerNorm.
// s = x + r (rounded to T, as the composed add), y = LayerNorm(s)·w + b, statistics in f32
// (two passes: mean, then the biased variance, as torch). With r null: y = LayerNorm(x), s
// not written. One block per row of C: at decode's few rows (B) every SM that works has a
// whole block, where candle's layer norm took 15.6 µs for one row of 768.
//   x, r, s, y: (rows, C); w, b: (C,)
// The same with a 16-byte vector of the row a thread (`vec`: C a multiple of the vector, at most
// one vector a thread, 16-byte aligned rows), the row kept in registers between the passes:
// one read of x and r instead of three (candle's layernorm_bf16 took 4.6 µs, the loop above
// with 256 threads 15.8 µs, for one row of 4096 in bloom-7b1's decode step).
template <typename T>
__device__ void add_layer_norm_vec(const T* x, const T* r, const T* w, const T* b, T* s, T* y, int c, float eps) {
  constexpr int N = 16 / sizeof(T);
  __shared__ float sh[32];
  const long off = (long)blockIdx.x * c + (long)threadIdx.x * N;
  const bool mine = threadIdx.x * N < c;
  float v[N];
  float sum = 0.f;
  if (mine) {
    const Vec16<T> xv = *reinterpret_cast<const Vec16<T>*>(x + off);
    if (r) {
      const Vec16<T> rv = *reinterpret_cast<const Vec16<T>*>(r + off);
      Vec16<T> sv;
#pragma unroll
      for (int i = 0; i < N; ++i) {
        sv.e[i] = from_f<T>(to_f(xv.e[i]) + to_f(rv.e[i]));
        v[i] = to_f(sv.e[i]);
      }
      *reinterpret_cast<Vec16<T>*>(s + off) = sv;
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = to_f(xv.e[i]);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) sum += v[i];
  }
  // w and b loaded before the reductions, so that their latency hides under them.
  const int j = threadIdx.x * N;
  Vec16<T> wv, bv;
  if (mine) {
    wv = *reinterpret_cast<const Vec16<T>*>(w + j);
    bv = *reinterpret_cast<const Vec16<T>*>(b + j);
  }
  const float mean = block_sum(sum, sh) / c;
  float var = 0.f;
  if (mine)
#pragma unroll
    for (int i = 0; i < N; ++i) var += (v[i] - mean) * (v[i] - mean);
  const float rstd = rsqrtf(block_sum(var, sh) / c + eps);
  if (!mine) return;
  Vec16<T> yv;
#pragma unroll
  for (int i = 0; i < N; ++i) yv.e[i] = from_f<T>((v[i] - mean) * rstd * to_f(wv.e[i]) + to_f(bv.e[i]));
  *reinterpret_cast<Vec16<T>*>(y + off) = yv;
}

template <typename T>
__device__ void add_layer_norm(const T* x, const T* r, const T* w, const T* b, T* s, T* y, int c, float eps) {
  __shared__ float sh[32];
  const long off = (long)blockIdx.x * c;
  // The row this thread reads back: s where it wrote it (the same j, so no sync), else x.
  const T* src = r ? s + off : x + off;
  float sum = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    float v = to_f(x[off + j]);
    if (r) {
      const T t = from_f<T>(v + to_f(r[off + j]));
      s[off + j] = t;
      v = to_f(t);
    }
    sum += v;
  }
  const float mean = block_sum(sum, sh) / c;
  float var = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    const float d = to_f(src[j]) - mean;
    var += d * d;
  }
  const float rstd = rsqrtf(block_sum(var, sh) / c + eps);
  for (int j = threadIdx.x; j < c; j += blockDim.x)
    y[off + j] = from_f<T>((to_f(src[j]) - mean) * rstd * to_f(w[j]) + to_f(b[j]));
}

// Each decode-step kernel twice: waiting first (pdl_begin) and, named _tf, letting the next
// kernel start first (pdl_begin_trigger_first, `--fused trigger-first`).
#define LN_FWD(T, S, TF, BEGIN)                                                                    \
  extern "C" __global__ void tb_layer_norm_fwd##TF##_##S(const T* x, const T* w, const T* b, T* y, \
                                                         long rows, int c, float eps) {            \
    BEGIN();                                                                                       \
    layer_norm_fwd<T>(x, w, b, y, rows, c, eps);                                                   \
  }
#define ADD_LN(T, S, TF, BEGIN)                                                                    \
  extern "C" __global__ void tb_add_layer_norm##TF##_##S(const T* x, const T* r, const T* w,      \
                                                         const T* b, T* s, T* y, int c, float eps, \
                                                         int vec) {                                \
    BEGIN();                                                                                       \
    if (vec)                                                                                       \
      add_layer_norm_vec<T>(x, r, w, b, s, y, c, eps);                                             \
    else                                                                                           \
      add_layer_norm<T>(x, r, w, b, s, y, c, eps);                                                 \
  }
#define INSTANTIATE(T, S)                                                                                     \
  LN_FWD(T, S, , pdl_begin) LN_FWD(T, S, _tf, pdl_begin_trigger_first)                                        \
  extern "C" __global__ void tb_layer_norm_bwd_x_##S(const T* x, const T* w, const T* dy, T* dx, long rows,   \
                                                     int c, float eps) {                                      \
    layer_norm_bwd_x<T>(x, w, dy, dx, rows, c, eps);                                                          \
  }                                                                                                           \
  extern "C" __global__ void tb_layer_norm_bwd_wb_##S(const T* x, const T* dy, float* part, long rows, int c, \
                                                      float eps) {                                            \
    layer_norm_bwd_wb<T>(x, dy, part, rows, c, eps);                                                          \
  }                                                                                                           \
  ADD_LN(T, S, , pdl_begin) ADD_LN(T, S, _tf, pdl_begin_trigger_first)
FOR_TYPES(INSTANTIATE)

#define FWD_VEC(T, S, V, TF, BEGIN)                                                                \
  extern "C" __global__ void tb_layer_norm_fwd_vec##V##TF##_##S(const T* x, const T* w, const T* b, \
                                                                T* y, long rows, int c, float eps) { \
    BEGIN();                                                                                         \
    layer_norm_fwd_vec<T, V>(x, w, b, y, rows, c, eps);                                              \
  }
// tb_layer_norm_{fwd,bwd}_vec<V>_<type>: V = 1..8 vectors a lane.
#define BWD_VEC(T, S, V)                                                                                   \
  extern "C" __global__ void __launch_bounds__(256) tb_layer_norm_bwd_vec##V##_##S(                        \
      const T* x, const T* w, const T* dy, const T* res, int rsum, T* dx, float* part, long rows, int c,     \
      float eps) {                                                                                           \
    layer_norm_bwd_vec<T, V>(x, w, dy, res, rsum, dx, part, rows, c, eps);                                   \
  }                                                                                                        \
  FWD_VEC(T, S, V, , pdl_begin) FWD_VEC(T, S, V, _tf, pdl_begin_trigger_first)
#define BWD_VECS(T, S) \
  BWD_VEC(T, S, 1) BWD_VEC(T, S, 2) BWD_VEC(T, S, 3) BWD_VEC(T, S, 4) BWD_VEC(T, S, 5) BWD_VEC(T, S, 6) BWD_VEC(T, S, 7) BWD_VEC(T, S, 8)
FOR_TYPES(BWD_VECS)
