// Bias + activation (#10), forward and backward; launched by bias_act.rs.
// Shapes: x, y, dy, dx (rows, n) contiguous, bias (n,), all storage type T; db (n,) f32.
#include "common.cuh"

// Bias + activation over (rows, n), contiguous: y = act(x + bias). act: 0 none, 1 GELU (tanh
// approximation: gelu_new, bloom_gelu), 2 GELU (erf), 3 ReLU. candle's broadcast add indexes
// the bias through the generic strided path, and the activation is a second pass.
__device__ __forceinline__ float act_f(float x, int act) {
  switch (act) {
    case 1: return gelu_tanh(x);
    case 2: return 0.5f * x * (1.f + erff(x * 0.7071067811865476f));
    case 3: return fmaxf(x, 0.f);
    default: return x;
  }
}
__device__ __forceinline__ float act_grad(float x, int act) {
  switch (act) {
    case 1: {
      const float c = 0.7978845608028654f, t = tanhf(c * (x + 0.044715f * x * x * x));
      return 0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * c * (1.f + 3.f * 0.044715f * x * x);
    }
    case 2: return 0.5f * (1.f + erff(x * 0.7071067811865476f)) + x * expf(-0.5f * x * x) * 0.3989422804014327f;
    case 3: return x > 0.f ? 1.f : 0.f;
    default: return 1.f;
  }
}
// grid: (column blocks, row blocks); each thread walks rows with a grid stride.
template <typename T>
__device__ void bias_act_fwd(const T* x, const T* bias, T* y, long rows, int n, int act) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const float bc = to_f(bias[c]);
  for (long r = blockIdx.y; r < rows; r += gridDim.y) y[r * n + c] = from_f<T>(act_f(to_f(x[r * n + c]) + bc, act));
}
// dx = dy ⊙ act'(x + bias), x the pre-bias input.
template <typename T>
__device__ void bias_act_bwd(const T* x, const T* bias, const T* dy, T* dx, long rows, int n, int act) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const float bc = to_f(bias[c]);
  for (long r = blockIdx.y; r < rows; r += gridDim.y) {
    const long i = r * n + c;
    dx[i] = from_f<T>(to_f(dy[i]) * act_grad(to_f(x[i]) + bc, act));
  }
}

// The bias gradient db = Σ_rows dy (f32), in two passes so that the sum's order is fixed:
// pass 1, grid (column blocks of 32, row chunks): each block sums its chunk of rows for 32
// columns (threads along y take every blockDim.y-th row) into part (chunks, n);
// pass 2 sums the chunks of each column in order. candle's sum(0) ran one slow pass.
template <typename T>
__device__ void col_sum_part(const T* x, float* part, long rows, int n) {
  __shared__ float sh[16][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  const long per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per;
  const long r1 = r0 + per < rows ? r0 + per : rows;
  float s = 0.f;
  if (c < n)
    for (long r = r0 + threadIdx.y; r < r1; r += blockDim.y) s += to_f(x[r * n + c]);
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < n) {
    float t = 0.f;
    for (int y = 0; y < blockDim.y; ++y) t += sh[y][threadIdx.x];
    part[blockIdx.y * (long)n + c] = t;
  }
}
extern "C" __global__ void tb_col_sum_finish(const float* part, float* out, int chunks, int n) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= n) return;
  float t = 0.f;
  for (int k = 0; k < chunks; ++k) t += part[(long)k * n + c];
  out[c] = t;
}

// The same three in 16-byte vectors (E = 16 / sizeof(T) elements a thread), for n a multiple
// of E and 16-byte aligned rows: the scalar kernels above moved 2 bytes a thread and ran at
// about a third of the bandwidth (docs/perf-notes.md).
template <typename T>
__device__ void bias_act_fwd_vec(const T* x, const T* bias, T* y, long rows, int n, int act) {
  constexpr int E = 16 / sizeof(T);
  const int per_row = n / E;
  const long total = rows * per_row;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const Vec16<T> xv = reinterpret_cast<const Vec16<T>*>(x)[i];
    const Vec16<T> bv = reinterpret_cast<const Vec16<T>*>(bias)[i % per_row];
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < E; j++) out.e[j] = from_f<T>(act_f(to_f(xv.e[j]) + to_f(bv.e[j]), act));
    reinterpret_cast<Vec16<T>*>(y)[i] = out;
  }
}

template <typename T>
__device__ void bias_act_bwd_vec(const T* x, const T* bias, const T* dy, T* dx, long rows, int n, int act) {
  constexpr int E = 16 / sizeof(T);
  const int per_row = n / E;
  const long total = rows * per_row;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const Vec16<T> xv = reinterpret_cast<const Vec16<T>*>(x)[i];
    const Vec16<T> dv = reinterpret_cast<const Vec16<T>*>(dy)[i];
    const Vec16<T> bv = reinterpret_cast<const Vec16<T>*>(bias)[i % per_row];
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < E; j++) out.e[j] = from_f<T>(to_f(dv.e[j]) * act_grad(to_f(xv.e[j]) + to_f(bv.e[j]), act));
    reinterpret_cast<Vec16<T>*>(dx)[i] = out;
  }
}

// The vector kernels' block ending: each thread's E column sums s (its rows) added over
// threadIdx.y in order, through sh, into row blockIdx.y of part (chunks, n).
template <int E>
__device__ __forceinline__ void col_sums_out(const float (&s)[E], float (*sh)[32 * E + 1], float* part, int n) {
#pragma unroll
  for (int j = 0; j < E; j++) sh[threadIdx.y][threadIdx.x * E + j] = s[j];
  __syncthreads();
  const int t = threadIdx.y * 32 + threadIdx.x, c = blockIdx.x * 32 * E + t;
  if (t < 32 * E && c < n) {
    float tot = 0.f;
    for (int y = 0; y < blockDim.y; ++y) tot += sh[y][t];
    part[blockIdx.y * (long)n + c] = tot;
  }
}

// col_sum_part with a thread summing E adjacent columns: grid (⌈n / (32·E)⌉, row chunks),
// block (32, 16); part (chunks, n) as there.
template <typename T>
__device__ void col_sum_part_vec(const T* x, float* part, long rows, int n) {
  constexpr int E = 16 / sizeof(T);
  __shared__ float sh[16][32 * E + 1];
  const int cv = blockIdx.x * 32 + threadIdx.x, per_row = n / E;
  const long per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per;
  const long r1 = r0 + per < rows ? r0 + per : rows;
  float s[E];
#pragma unroll
  for (int j = 0; j < E; j++) s[j] = 0.f;
  if (cv < per_row)
    for (long r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const Vec16<T> v = reinterpret_cast<const Vec16<T>*>(x)[r * per_row + cv];
#pragma unroll
      for (int j = 0; j < E; j++) s[j] += to_f(v.e[j]);
    }
  col_sums_out<E>(s, sh, part, n);
}

// bias_act_bwd_vec and col_sum_part_vec in one pass (the MLP's backward): grid and block as
// col_sum_part_vec's, each thread writing dx for its vector column down its rows. The column
// sums add dx as stored (rounded to T) in col_sum_part_vec's order, so with the same grid, part
// is the two-pass path's bit for bit; dx is not read back.
template <typename T>
__device__ void bias_act_bwd_sum_vec(const T* x, const T* bias, const T* dy, T* dx, float* part, long rows,
                                     int n, int act) {
  constexpr int E = 16 / sizeof(T);
  __shared__ float sh[16][32 * E + 1];
  const int cv = blockIdx.x * 32 + threadIdx.x, per_row = n / E;
  const long per = (rows + gridDim.y - 1) / gridDim.y, r0 = blockIdx.y * per;
  const long r1 = r0 + per < rows ? r0 + per : rows;
  float s[E];
#pragma unroll
  for (int j = 0; j < E; j++) s[j] = 0.f;
  if (cv < per_row) {
    const Vec16<T> bv = reinterpret_cast<const Vec16<T>*>(bias)[cv];
    for (long r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const long i = r * per_row + cv;
      const Vec16<T> xv = reinterpret_cast<const Vec16<T>*>(x)[i];
      const Vec16<T> dv = reinterpret_cast<const Vec16<T>*>(dy)[i];
      Vec16<T> out;
#pragma unroll
      for (int j = 0; j < E; j++) {
        out.e[j] = from_f<T>(to_f(dv.e[j]) * act_grad(to_f(xv.e[j]) + to_f(bv.e[j]), act));
        s[j] += to_f(out.e[j]);
      }
      reinterpret_cast<Vec16<T>*>(dx)[i] = out;
    }
  }
  col_sums_out<E>(s, sh, part, n);
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_bias_act_fwd_##S(const T* x, const T* bias, T* y, long rows, int n, int act) { \
    bias_act_fwd<T>(x, bias, y, rows, n, act);                                                                \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_##S(const T* x, const T* bias, const T* dy, T* dx, long rows,    \
                                                 int n, int act) {                                            \
    bias_act_bwd<T>(x, bias, dy, dx, rows, n, act);                                                           \
  }                                                                                                           \
  extern "C" __global__ void tb_col_sum_part_##S(const T* x, float* part, long rows, int n) {                 \
    col_sum_part<T>(x, part, rows, n);                                                                        \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_fwd_vec_##S(const T* x, const T* bias, T* y, long rows, int n,       \
                                                     int act) {                                               \
    bias_act_fwd_vec<T>(x, bias, y, rows, n, act);                                                            \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_vec_##S(const T* x, const T* bias, const T* dy, T* dx, long rows, \
                                                     int n, int act) {                                        \
    bias_act_bwd_vec<T>(x, bias, dy, dx, rows, n, act);                                                       \
  }                                                                                                           \
  extern "C" __global__ void tb_col_sum_part_vec_##S(const T* x, float* part, long rows, int n) {             \
    col_sum_part_vec<T>(x, part, rows, n);                                                                    \
  }                                                                                                           \
  extern "C" __global__ void tb_bias_act_bwd_sum_vec_##S(const T* x, const T* bias, const T* dy, T* dx,       \
                                                         float* part, long rows, int n, int act) {            \
    bias_act_bwd_sum_vec<T>(x, bias, dy, dx, part, rows, n, act);                                             \
  }
FOR_TYPES(INSTANTIATE)
