// Fused causal attention for training (#21 item 2), launched by flash_attn.rs: FlashAttention-2's
// tiling on tensor cores (wmma 16×16×16, bf16/f16 in, f32 accumulate). The (T, T) scores never
// reach memory: the forward keeps one log-sum-exp a row, the backward recomputes the
// probabilities from it. The composed path (two batched matmuls + attn_softmax.cu, and five
// matmuls + its backward) wrote and read them at 201 MB a layer for gpt2 at 8 × 1024.
//
// Shapes: B batch, T time, nh heads, HS = 64 head size, C = nh·HS.
//   qkv, dqkv (B, T, 3C) = [q | k | v], the attention projection's rows, read and written in
//   place (no head split or merge); y, dy (B, T, C); lse, dsum (B, nh, T) f32.
// A block of 4 warps takes 64 rows of one (b, h): each warp 16 rows; a loop walks the 64-row
// tiles of the other side up to the diagonal (causal). Every product is warp-local; the shared
// tiles are the operands all four warps read.
// The fragments' element → (row, col) map is unspecified, so each warp reads it once from a
// fragment loaded with row (col) numbers: the element-wise steps then run in registers.
// lse is kept in base 2 (m·log2 e + log2 l): the scores are scaled by scale·log2 e once.
#include "common.cuh"
#include <mma.h>
using namespace nvcuda;

#define HS 64
#define TILE 64
#define WARPS 4
#define LD (HS + 8)     // shared row stride of a 16-bit tile (skews banks; 16-byte multiple)
#define LDF (TILE + 4)  // shared row stride of an f32 warp tile

template <typename T> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T> using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
template <typename T> using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// dst[r][:] (64 × HS, stride LD) = rows t0 + r of src (stride `stride` elements); zeros past T.
template <typename T>
__device__ void load_tile(T* dst, const T* src, long stride, int t0, int T_) {
  constexpr int V = HS * sizeof(T) / 16;  // 16-byte vectors a row
  for (int i = threadIdx.x; i < TILE * V; i += blockDim.x) {
    const int r = i / V, v = i % V, t = t0 + r;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (t < T_) x = *reinterpret_cast<const uint4*>(src + t * stride + v * (16 / sizeof(T)));
    *reinterpret_cast<uint4*>(dst + r * LD + v * (16 / sizeof(T))) = x;
  }
}

// Each element's row and column within a 16×16 accumulator fragment, read through the fragment
// map; scratch: the warp's 16 × LDF floats.
__device__ void fragment_map(Acc& rows, Acc& cols, float* scratch) {
  const int lane = threadIdx.x & 31;
  for (int i = lane; i < 256; i += 32) scratch[(i / 16) * LDF + i % 16] = (float)(i / 16);
  __syncwarp();
  wmma::load_matrix_sync(rows, scratch, LDF, wmma::mem_row_major);
  __syncwarp();
  for (int i = lane; i < 256; i += 32) scratch[(i / 16) * LDF + i % 16] = (float)(i % 16);
  __syncwarp();
  wmma::load_matrix_sync(cols, scratch, LDF, wmma::mem_row_major);
  __syncwarp();
}

// Writes a warp's 16 × HS result acc·factor to rows t0.. of out (stride `stride`), rows < T,
// through the warp's f32 staging tile; two lanes a row, 32 columns each.
template <typename T>
__device__ void store_rows(Acc (&acc)[4], float factor, float* stage, T* out, long stride, int t0, int T_) {
  const int lane = threadIdx.x & 31, r = lane / 2, c0 = (lane % 2) * 32;
  for (int n = 0; n < 4; n++) {
    for (int e = 0; e < acc[n].num_elements; e++) acc[n].x[e] *= factor;
    wmma::store_matrix_sync(stage + n * 16, acc[n], LDF, wmma::mem_row_major);
  }
  __syncwarp();
  if (t0 + r < T_) {
    T* dst = out + (long)(t0 + r) * stride + c0;
    for (int c = 0; c < 32; c++) dst[c] = from_f<T>(stage[r * LDF + c0 + c]);
  }
  __syncwarp();
}

// A warp's 16 × HS rows of a shared tile as four matrix_a fragments (k = head dims).
template <typename T>
__device__ void load_rows_a(FragA<T> (&a)[4], const T* tile) {
  for (int kk = 0; kk < 4; kk++) wmma::load_matrix_sync(a[kk], tile + kk * 16, LD);
}

// out[n] (16 × 64) = a (16 × HS) · tileᵀ, tile (64 × HS) in shared memory: scores against a
// tile's 64 rows.
template <typename T>
__device__ void mul_transposed(Acc (&out)[4], const FragA<T> (&a)[4], const T* tile) {
  FragBCol<T> b;
  for (int n = 0; n < 4; n++) {
    wmma::fill_fragment(out[n], 0.f);
    for (int kk = 0; kk < 4; kk++) {
      wmma::load_matrix_sync(b, tile + n * 16 * LD + kk * 16, LD);
      wmma::mma_sync(out[n], a[kk], b, out[n]);
    }
  }
}

// acc[n] (16 × HS) += p (16 × 64, shared, stride LD) · tile (64 × HS).
template <typename T>
__device__ void mul_acc(Acc (&acc)[4], const T* p, const T* tile) {
  FragA<T> a[4];
  load_rows_a(a, p);
  FragBRow<T> b;
  for (int n = 0; n < 4; n++)
    for (int kk = 0; kk < 4; kk++) {
      wmma::load_matrix_sync(b, tile + kk * 16 * LD + n * 16, LD);
      wmma::mma_sync(acc[n], a[kk], b, acc[n]);
    }
}

// Shared memory of the forward: the K and V tiles (Q staged in k first), each warp's f32
// scores and its probabilities, and the running max, sum and rescale of its rows.
template <typename T> struct FwdShared {
  T k[TILE * LD], v[TILE * LD];
  float s[WARPS][16 * LDF];
  T p[WARPS][16 * LD];
  float m[WARPS][16], l[WARPS][16], alpha[WARPS][16];
};

// One online-softmax step of a warp's 16 rows over the key tile at k0 (scores in s, raw q·k):
// probabilities into p, the running max / sum updated, the rescale of the earlier output into
// alpha. Two lanes a row, 32 keys each.
template <typename T>
__device__ void online_softmax(FwdShared<T>& sh, int w, int q_row0, int k0, int T_, float scale2) {
  const int lane = threadIdx.x & 31, r = lane / 2, c0 = (lane % 2) * 32, q = q_row0 + r;
  float* s = sh.s[w] + r * LDF + c0;
  float mx = -INFINITY;
  for (int c = 0; c < 32; c++) {
    const int key = k0 + c0 + c;
    const float x = (key > q || key >= T_) ? -INFINITY : s[c] * scale2;
    s[c] = x;
    mx = fmaxf(mx, x);
  }
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
  const float m_old = sh.m[w][r], m_new = fmaxf(m_old, mx);
  float sum = 0.f;
  for (int c = 0; c < 32; c++) {
    const float p = exp2f(s[c] - m_new);
    sum += p;
    sh.p[w][r * LD + c0 + c] = from_f<T>(p);
  }
  sum += __shfl_xor_sync(0xffffffff, sum, 1);
  __syncwarp();
  if (c0 == 0) {
    const float alpha = exp2f(m_old - m_new);  // 0 on the first tile (m_old = −∞)
    sh.l[w][r] = sh.l[w][r] * alpha + sum;
    sh.m[w][r] = m_new;
    sh.alpha[w][r] = alpha;
  }
  __syncwarp();
}

// y = softmax(q kᵀ·scale, causal) v, and lse. Grid (⌈T/64⌉, B·nh), 128 threads; the query
// tiles run longest first.
template <typename T>
__device__ void flash_fwd(const T* qkv, T* y, float* lse, int T_, int nh, float scale2) {
  __shared__ __align__(32) FwdShared<T> sh;
  const int w = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, q0 = qt * TILE, qw = q0 + w * 16;
  const long stride = 3L * C;
  const T* q_src = qkv + (long)b * T_ * stride + h * HS;
  load_tile(sh.k, q_src, stride, q0, T_);
  if (lane < 16) sh.m[w][lane] = -INFINITY, sh.l[w][lane] = 0.f;
  __syncthreads();
  FragA<T> qa[4];
  load_rows_a(qa, sh.k + w * 16 * LD);
  Acc rows, cols, s[4], o[4];
  fragment_map(rows, cols, sh.s[w]);
  for (int n = 0; n < 4; n++) wmma::fill_fragment(o[n], 0.f);
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE;
    __syncthreads();  // every warp is done with the previous tiles
    load_tile(sh.k, q_src + C, stride, k0, T_);
    load_tile(sh.v, q_src + 2 * C, stride, k0, T_);
    __syncthreads();
    mul_transposed(s, qa, sh.k);
    for (int n = 0; n < 4; n++) wmma::store_matrix_sync(sh.s[w] + n * 16, s[n], LDF, wmma::mem_row_major);
    __syncwarp();
    online_softmax(sh, w, qw, k0, T_, scale2);
    for (int n = 0; n < 4; n++)
      for (int e = 0; e < o[n].num_elements; e++) o[n].x[e] *= sh.alpha[w][(int)rows.x[e]];
    mul_acc(o, sh.p[w], sh.v);
  }
  for (int n = 0; n < 4; n++)
    for (int e = 0; e < o[n].num_elements; e++) o[n].x[e] /= sh.l[w][(int)rows.x[e]];
  store_rows(o, 1.f, sh.s[w], y + (long)b * T_ * C + h * HS, C, qw, T_);
  if (lane < 16 && qw + lane < T_) lse[(long)bh * T_ + qw + lane] = sh.m[w][lane] + log2f(sh.l[w][lane]);
}

// dsum[b, h, t] = Σ_d dy · y over a head's row: one warp a row, grid-strided.
template <typename T>
__device__ void flash_bwd_dsum(const T* y, const T* dy, float* dsum, int B, int T_, int nh) {
  const int lane = threadIdx.x & 31;
  const long rows = (long)B * T_ * nh, warps = (long)gridDim.x * blockDim.x / 32;
  for (long i = (blockIdx.x * (long)blockDim.x + threadIdx.x) / 32; i < rows; i += warps) {
    const long bt = i / nh, h = i % nh, b = bt / T_, t = bt % T_;
    const long at = bt * nh * HS + h * HS;
    float acc = 0.f;
    for (int d = lane; d < HS; d += 32) acc += to_f(y[at + d]) * to_f(dy[at + d]);
    acc = warp_sum(acc);
    if (lane == 0) dsum[(b * nh + h) * T_ + t] = acc;
  }
}

// Shared memory of the backward kernels: two 64-row operand tiles, each warp's 16-bit
// probabilities / score gradients and its f32 staging tile, and 64 rows' lse and dsum.
template <typename T> struct BwdShared {
  T a[TILE * LD], b[TILE * LD];
  T p[WARPS][16 * LD];
  float stage[WARPS][16 * LDF];
  float lse[TILE], dsum[TILE];
};

template <typename T>
__device__ void load_row_stats(BwdShared<T>& sh, const float* lse, const float* dsum, long at, int t0, int T_) {
  for (int i = threadIdx.x; i < TILE; i += blockDim.x) {
    const bool in = t0 + i < T_;
    sh.lse[i] = in ? lse[at + t0 + i] : 0.f;
    sh.dsum[i] = in ? dsum[at + t0 + i] : 0.f;
  }
}

// dk and dv of one 64-key tile: for every query tile at or past it (Q and dO in the shared
// tiles a, b), sᵀ = k qᵀ, pᵀ from lse, dv += pᵀ dO, dpᵀ = v dOᵀ, dsᵀ = pᵀ ⊙ (dpᵀ − dsum),
// dk += dsᵀ q · scale. Grid (⌈T/64⌉, B·nh), 128 threads.
template <typename T>
__device__ void flash_bwd_dkv(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,
                              int nh, float scale, float scale2) {
  __shared__ __align__(32) BwdShared<T> sh;
  const int w = threadIdx.x / 32, kt = blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, k0 = kt * TILE, kw = k0 + w * 16;
  const long stride = 3L * C, row0 = (long)b * T_;
  const T* q_src = qkv + row0 * stride + h * HS;
  const T* dy_src = dy + row0 * C + h * HS;
  load_tile(sh.a, q_src + C, stride, k0, T_);
  load_tile(sh.b, q_src + 2 * C, stride, k0, T_);
  __syncthreads();
  FragA<T> ka[4], va[4];
  load_rows_a(ka, sh.a + w * 16 * LD);
  load_rows_a(va, sh.b + w * 16 * LD);
  Acc rows, cols, s[4], dp[4], dk[4], dv[4];
  fragment_map(rows, cols, sh.stage[w]);
  for (int n = 0; n < 4; n++) wmma::fill_fragment(dk[n], 0.f), wmma::fill_fragment(dv[n], 0.f);
  for (int qt = kt; qt * TILE < T_; qt++) {
    const int q0 = qt * TILE;
    __syncthreads();
    load_tile(sh.a, q_src, stride, q0, T_);
    load_tile(sh.b, dy_src, C, q0, T_);
    load_row_stats(sh, lse, dsum, (long)bh * T_, q0, T_);
    __syncthreads();
    mul_transposed(s, ka, sh.a);  // sᵀ (16 keys × 64 queries)
    T* p = sh.p[w];
    for (int n = 0; n < 4; n++)
      for (int e = 0; e < s[n].num_elements; e++) {
        const int r = (int)rows.x[e], c = n * 16 + (int)cols.x[e];
        const bool seen = kw + r <= q0 + c && q0 + c < T_;
        s[n].x[e] = seen ? exp2f(s[n].x[e] * scale2 - sh.lse[c]) : 0.f;
        p[r * LD + c] = from_f<T>(s[n].x[e]);
      }
    __syncwarp();
    mul_acc(dv, p, sh.b);
    mul_transposed(dp, va, sh.b);  // dpᵀ (16 keys × 64 queries)
    __syncwarp();                  // every lane has read p
    for (int n = 0; n < 4; n++)
      for (int e = 0; e < s[n].num_elements; e++) {
        const int r = (int)rows.x[e], c = n * 16 + (int)cols.x[e];
        p[r * LD + c] = from_f<T>(s[n].x[e] * (dp[n].x[e] - sh.dsum[c]));
      }
    __syncwarp();
    mul_acc(dk, p, sh.a);
  }
  T* out = dqkv + row0 * stride + h * HS;
  store_rows(dk, scale, sh.stage[w], out + C, stride, kw, T_);
  store_rows(dv, 1.f, sh.stage[w], out + 2 * C, stride, kw, T_);
}

// dq of one 64-query tile (its q and dO held as fragments): for every key tile up to the
// diagonal (K and V in the shared tiles a, b), s = q kᵀ, p from lse, dp = dO vᵀ,
// ds = p ⊙ (dp − dsum), dq += ds k · scale. Grid (⌈T/64⌉, B·nh), longest first.
template <typename T>
__device__ void flash_bwd_dq(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,
                             int nh, float scale, float scale2) {
  __shared__ __align__(32) BwdShared<T> sh;
  const int w = threadIdx.x / 32, qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int C = nh * HS, q0 = qt * TILE, qw = q0 + w * 16;
  const long stride = 3L * C, row0 = (long)b * T_;
  const T* q_src = qkv + row0 * stride + h * HS;
  load_tile(sh.a, q_src, stride, q0, T_);
  load_tile(sh.b, dy + row0 * C + h * HS, C, q0, T_);
  load_row_stats(sh, lse, dsum, (long)bh * T_, q0, T_);
  __syncthreads();
  FragA<T> qa[4], doa[4];
  load_rows_a(qa, sh.a + w * 16 * LD);
  load_rows_a(doa, sh.b + w * 16 * LD);
  Acc rows, cols, s[4], dp[4], dq[4];
  fragment_map(rows, cols, sh.stage[w]);
  for (int n = 0; n < 4; n++) wmma::fill_fragment(dq[n], 0.f);
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE;
    __syncthreads();
    load_tile(sh.a, q_src + C, stride, k0, T_);
    load_tile(sh.b, q_src + 2 * C, stride, k0, T_);
    __syncthreads();
    mul_transposed(s, qa, sh.a);
    mul_transposed(dp, doa, sh.b);
    T* p = sh.p[w];
    for (int n = 0; n < 4; n++)
      for (int e = 0; e < s[n].num_elements; e++) {
        const int r = (int)rows.x[e], c = n * 16 + (int)cols.x[e], row = w * 16 + r;
        const bool seen = k0 + c <= q0 + row && k0 + c < T_;
        const float pr = seen ? exp2f(s[n].x[e] * scale2 - sh.lse[row]) : 0.f;
        p[r * LD + c] = from_f<T>(pr * (dp[n].x[e] - sh.dsum[row]));
      }
    __syncwarp();
    mul_acc(dq, p, sh.a);
    __syncwarp();  // every lane has read p before the next tile writes it
  }
  store_rows(dq, scale, sh.stage[w], dqkv + row0 * stride + h * HS, stride, qw, T_);
}

#define FLASH(T, S)                                                                                          \
  extern "C" __global__ void __launch_bounds__(128) tb_flash_fwd_##S(const T* qkv, T* y, float* lse, int T_, \
                                                                     int nh, float scale2) {                 \
    flash_fwd<T>(qkv, y, lse, T_, nh, scale2);                                                               \
  }                                                                                                          \
  extern "C" __global__ void tb_flash_bwd_dsum_##S(const T* y, const T* dy, float* dsum, int B, int T_, int nh) { \
    flash_bwd_dsum<T>(y, dy, dsum, B, T_, nh);                                                               \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dkv_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,  \
                           int nh, float scale, float scale2) {                                              \
    flash_bwd_dkv<T>(qkv, dy, lse, dsum, dqkv, T_, nh, scale, scale2);                                       \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_bwd_dq_##S(const T* qkv, const T* dy, const float* lse, const float* dsum, T* dqkv, int T_,   \
                          int nh, float scale, float scale2) {                                               \
    flash_bwd_dq<T>(qkv, dy, lse, dsum, dqkv, T_, nh, scale, scale2);                                        \
  }
FLASH(__nv_bfloat16, bf16)
FLASH(__half, f16)
