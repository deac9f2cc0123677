// A decode step's LM head at 1-16 rows on tensor cores (#20), launched by skinny.rs ("skinny"
// GEMM: M far smaller than N and K): logits = x Wᵀ for W (V, C) in nn.Linear's layout. Where V is
// no multiple of 8 (GPT-2's 50257) cuBLAS falls back to an sm75 kernel that reads W at 0.8 TB/s
// (docs/perf-notes.md); one mma.sync m16n8k16 takes all 16 rows of x against an 8-column W
// tile, so W is read once, in 16-byte vectors.
//
// Shapes: x (M, K), W (N, K), y (M, N), contiguous; M <= 16; K % 32 == 0; any N (rows of W past
// N read as zeros). Block: WARPS warps, one COLS-column tile of y; warp w takes every WARPS-th
// 32-wide slice of K; their sums meet in shared memory.
//
// The order of k inside a slice is free (a dot product), and is chosen so that every operand is
// one 16-byte load a lane: lane (g, t) = (lane / 4, lane % 4) holds elements 8t..8t+7 of its
// x rows (g, g + 8) and of its W row, and mma j (0, 1) takes elements 4j..4j+3 of them as the
// fragment's k = 2t, 2t+1 (4j, 4j+1) and 2t+8, 2t+9 (4j+2, 4j+3).
#include "common.cuh"

constexpr int WARPS = 8, U = 4, NT = 2, COLS = 8 * NT;  // U: slices a warp loads before its mmas

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

struct Words { uint32_t w[4]; };  // a 16-byte vector as four pairs of 16-bit elements

template <typename T>
__device__ void skinny(const T* x, const T* w, T* y, int m, int n, int k) {
  __shared__ float part[WARPS][16][COLS];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int n0 = blockIdx.x * COLS, slices = k / 32;
  const Words zero = {{0, 0, 0, 0}};
  float c[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++) c[i][0] = c[i][1] = c[i][2] = c[i][3] = 0.f;
  const Words* xa = (const Words*)(x + (long)g * k) + t;        // row g, elements 8t.. of slice 0
  const Words* xb = (const Words*)(x + (long)(g + 8) * k) + t;  // row g + 8
  for (int s0 = warp; s0 < slices; s0 += WARPS * U) {
    Words va[U], vb[U], wv[U][NT];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const int s = s0 + u * WARPS;
      const bool live = s < slices;
      va[u] = live && g < m ? xa[s * 4] : zero;
      vb[u] = live && g + 8 < m ? xb[s * 4] : zero;
#pragma unroll
      for (int i = 0; i < NT; i++) {  // W row n0 + 8i + g, elements 32s + 8t..
        const int col = n0 + 8 * i + g;
        wv[u][i] = live && col < n ? *((const Words*)(w + (long)col * k + s * 32) + t) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (s0 + u * WARPS >= slices) break;  // the same for the whole warp
#pragma unroll
      for (int i = 0; i < NT; i++)
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const uint32_t a[4] = {va[u].w[2 * j], vb[u].w[2 * j], va[u].w[2 * j + 1], vb[u].w[2 * j + 1]};
          mma<T>(c[i], a, wv[u][i].w[2 * j], wv[u][i].w[2 * j + 1]);
        }
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
  __syncthreads();
  for (int e = threadIdx.x; e < m * COLS; e += blockDim.x) {
    const int r = e / COLS, col = n0 + e % COLS;
    if (col >= n) continue;
    float v = 0.f;
#pragma unroll
    for (int s = 0; s < WARPS; s++) v += part[s][r][e % COLS];
    y[(long)r * n + col] = from_f<T>(v);
  }
}

#define SKINNY(T, S)                                                                                   \
  extern "C" __global__ void __launch_bounds__(32 * WARPS) tb_skinny_##S(const T* x, const T* w, T* y, \
                                                                        int m, int n, int k) {       \
    skinny<T>(x, w, y, m, n, k);                                                                       \
  }
SKINNY(__nv_bfloat16, bf16)
SKINNY(__half, f16)
