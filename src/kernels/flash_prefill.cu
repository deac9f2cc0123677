// Causal attention over whole right-padded sequences for inference (#37 item 2: scoring and
// prefill forwards), launched by flash_prefill.rs: the training forward's FlashAttention-2
// tiling (flash_tiles.cuh) without lse or dropout, for head sizes 64 and 128, either head
// layout of the fused qkv projection, and BLOOM's ALiBi. The composed path split the heads
// out of qkv (three copies), wrote the (B, nh, T, T) scores, added a (B, nh, T, T) f32 bias,
// and merged the heads back (a fourth copy).
//
// Shapes: B batch, T padded time, nh heads, H head size, C = nh·H.
//   qkv (B, T, 3C): head h's q at column h·head_stride, its k `part` further, its v 2·part
//   (GPT-2 [q | k | v]: head_stride H, part C; BLOOM (nh, 3, H): 3H, H);
//   y (B, T, C), heads merged; lens (B) u32, the real rows of each sequence (right padding);
//   slopes (nh) f32 ALiBi slopes, or null.
// Or packed, the sequences end to end without padding: qkv (N, 3C), y (N, C), sequence b's
// rows from starts[b] (starts null: b·T, the padded layout).
// Row t of sequence b attends keys 0..t. Rows at or past lens[b] are not written (the
// launcher zeroes y); no real row reads a padded key, so padding never reaches real rows.
// ALiBi adds slope_h · s to the score of key s (HF's relative bias up to a per-row constant,
// which the softmax cancels).
// At the end: a generation's packed prefill's keys and values into its KV cache (tb_prefill_kv).
#include "flash_tiles.cuh"

// The operand tiles in dynamic shared memory (over 48 KiB at H = 128): keys and values in two
// buffers each (the one in use, the next arriving; q staged first where the second key tile
// goes), then each warp's 16 × TILE probabilities. After the loop the key tiles hold the warps'
// f32 staging (4 × 16 × stage_ld floats ≤ 2 tiles).
template <int H> __host__ __device__ constexpr int prefill_shared_elems() {
  return 4 * TILE * tile_ld<H>() + WARPS * 16 * LDP;
}

// Grid (⌈longest/64⌉, B·nh), 128 threads, the query tiles longest first; blocks past their
// sequence's length return at once. Each lane keeps the max and sum of its two rows (g, g + 8).
template <int H, typename T>
__device__ void flash_prefill(const T* qkv, T* y, const unsigned int* lens, const unsigned int* starts, int T_,
                              int nh, int head_stride, int part, float scale2, const float* slopes) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int TE = TILE * tile_ld<H>();
  T* k_tiles = reinterpret_cast<T*>(smem);  // [2][TE]
  T* v_tiles = k_tiles + 2 * TE;            // [2][TE]
  const int w = threadIdx.x / 32;
  const int qt = gridDim.x - 1 - blockIdx.x, bh = blockIdx.y, b = bh / nh, h = bh % nh;
  const int len = (int)lens[b], q0 = qt * TILE, qw = q0 + w * 16;
  if (q0 >= len) return;
  const int C = nh * H;
  const long stride = 3L * C;
  const long row0 = starts ? (long)starts[b] : (long)b * T_;
  const T* q_src = qkv + row0 * stride + (long)h * head_stride;
  const T* k_src = q_src + part;
  const T* v_src = q_src + 2 * part;
  // ALiBi in the base-2 domain of the scaled scores; 0 without.
  const float slope2 = slopes ? slopes[h] * 1.4426950408889634f : 0.f;
  float* stage = reinterpret_cast<float*>(smem) + w * 16 * stage_ld<H>();
  T* p = v_tiles + 2 * TE + w * 16 * LDP;
  int rc[8];
  fragment_map(rc, stage);
  __syncthreads();
  load_tile<H>(k_tiles + TE, q_src, stride, q0, len);  // q, staged where key tile 1 goes later
  load_tile<H>(k_tiles, k_src, stride, 0, len);
  load_tile<H>(v_tiles, v_src, stride, 0, len);
  cp_async_commit();
  cp_async_wait();
  __syncthreads();
  FragA<T> qa[H / 16];
  load_rows_a<H / 16, tile_ld<H>()>(qa, k_tiles + TE + w * 16 * tile_ld<H>());
  Acc s[TILE / 16], o[H / 16];
  #pragma unroll
  for (int n = 0; n < H / 16; n++) wmma::fill_fragment(o[n], 0.f);
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
  for (int kt = 0; kt <= qt; kt++) {
    const int k0 = kt * TILE, buf = kt & 1;
    cp_async_wait();
    __syncthreads();  // tile kt is in; every warp is done with tile kt − 1 (and q)
    if (kt < qt) {
      load_tile<H>(k_tiles + (buf ^ 1) * TE, k_src, stride, k0 + TILE, len);
      load_tile<H>(v_tiles + (buf ^ 1) * TE, v_src, stride, k0 + TILE, len);
      cp_async_commit();
    }
    mul_transposed<H>(s, qa, k_tiles + buf * TE);
    float x0 = -INFINITY, x1 = -INFINITY;
    #pragma unroll
    for (int n = 0; n < TILE / 16; n++)
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, key = k0 + n * 16 + (rc[e] & 15);
        const float v = (key > qw + r || key >= len) ? -INFINITY : s[n].x[e] * scale2 + slope2 * key;
        s[n].x[e] = v;
        if (r < 8) x0 = fmaxf(x0, v); else x1 = fmaxf(x1, v);
      }
    // Tile kt ≤ qt holds key k0 ≤ every row's position: each max is finite.
    const float n0 = fmaxf(m0, quad_max(x0)), n1 = fmaxf(m1, quad_max(x1));
    const float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);  // 0 on the first tile
    m0 = n0, m1 = n1;
    float s0 = 0.f, s1 = 0.f;
    #pragma unroll
    for (int n = 0; n < TILE / 16; n++)
      #pragma unroll
      for (int e = 0; e < 8; e++) {
        const int r = rc[e] >> 4, c = n * 16 + (rc[e] & 15);
        const float v = exp2f(s[n].x[e] - (r < 8 ? n0 : n1));
        if (r < 8) s0 += v; else s1 += v;
        p[r * LDP + c] = from_f<T>(v);
      }
    #pragma unroll
    for (int n = 0; n < H / 16; n++)
      #pragma unroll
      for (int e = 0; e < 8; e++) o[n].x[e] *= (rc[e] >> 4) < 8 ? a0 : a1;
    l0 = l0 * a0 + quad_sum(s0), l1 = l1 * a1 + quad_sum(s1);
    __syncwarp();
    mul_acc<H>(o, p, v_tiles + buf * TE);
  }
  #pragma unroll
  for (int n = 0; n < H / 16; n++)
    #pragma unroll
    for (int e = 0; e < 8; e++) o[n].x[e] /= (rc[e] >> 4) < 8 ? l0 : l1;
  __syncthreads();  // the key tiles become the staging
  store_rows<H>(o, 1.f, stage, y + row0 * C + h * H, C, qw, len);
}

#define PREFILL(T, S, H)                                                                                      \
  extern "C" __global__ void __launch_bounds__(128)                                                          \
      tb_flash_prefill##H##_##S(const T* qkv, T* y, const unsigned int* lens, const unsigned int* starts,   \
                                int T_, int nh, int head_stride, int part, float scale2, const float* slopes) { \
    flash_prefill<H, T>(qkv, y, lens, starts, T_, nh, head_stride, part, scale2, slopes);                    \
  }
PREFILL(__nv_bfloat16, bf16, 64)
PREFILL(__half, f16, 64)
PREFILL(__nv_bfloat16, bf16, 128)
PREFILL(__half, f16, 128)

// A generation's prefill run packed (#37 item 2): the real tokens' keys and values from qkv
// (N, 3C) into the KV caches k, v (B, nh, t_max, H) at the columns left padding gives them:
// sequence b's row j at column end − lens[b] + j; its padding columns (before end − lens[b])
// zeroed, so that no earlier batch's values stay in a reused cache. Columns from end on are
// not touched. Type-agnostic 16-byte copies: every size here (V = H / 8, head_stride, part,
// width = 3C) counts 16-byte vectors. Grid (x, B), one sequence a grid row; a thread a vector of
// a head's key and its value at one column.
extern "C" __global__ void tb_prefill_kv(const uint4* qkv, uint4* k, uint4* v, const unsigned int* lens,
                                         const unsigned int* starts, int nh, int V, int head_stride, int part,
                                         int width, int t_max, int end) {
  const int b = blockIdx.y;
  const long pad = end - (long)lens[b], start = starts[b], total = (long)end * nh * V;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long col = i / (nh * V), h = (i / V) % nh, e = i % V;
    const long dst = (((long)b * nh + h) * t_max + col) * V + e;
    if (col < pad) {
      k[dst] = v[dst] = make_uint4(0, 0, 0, 0);
    } else {
      const uint4* src = qkv + (start + col - pad) * width + h * head_stride + e;
      k[dst] = src[part];
      v[dst] = src[2 * part];
    }
  }
}
