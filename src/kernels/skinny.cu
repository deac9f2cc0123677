// Decode projections at 1-16 rows on tensor cores (#20), launched by skinny.rs ("skinny" GEMM:
// M far smaller than N and K). y = act(x Wᵀ + b) for nn.Linear weights W (N, K), or
// act(x W + b) for GPT-2's Conv1D weights W (K, N). At 16 rows cuBLAS's small-M kernels read
// the weights at 0.5-1.2 TB/s, the narrow outputs through split-K and a reduce
// (docs/perf-notes.md); one mma.sync m16n8k16 takes all 16 rows of x against an 8-column W
// tile, so W is read once, in 16-byte vectors, with no second launch.
//
// Shapes: x (M, K), W as above, b (N,) or null, y (M, N), contiguous; M <= 16; K % 32 == 0.
// Linear: any N (rows of W past N read as zeros); Conv1D: N % (8 * NT) == 0.
// Block: WARPS warps, one 8·NT-column tile of y; warp w takes every WARPS-th 32-wide slice of K;
// their sums meet in shared memory, where the bias and act (0 none, 1 tanh-GELU) are added.
//
// The order of k inside a slice is free (a dot product), and is chosen so that every operand is
// one 16-byte load a lane: lane (g, t) = (lane / 4, lane % 4) holds elements 8t..8t+7 of its
// x rows (g, g + 8) and of its W column, and mma j (0, 1) takes elements 4j..4j+3 of them as the
// fragment's k = 2t, 2t+1 (4j, 4j+1) and 2t+8, 2t+9 (4j+2, 4j+3). Conv1D's W rows run along N,
// so each lane's row is staged in shared memory at that logical k and read back transposed
// (ldmatrix .trans), which yields the same fragment.
#include "common.cuh"

constexpr int WARPS = 8, U = 4;  // U slices a warp loaded before its mmas (loads in flight)

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

// The four 8x8 matrices at rows[0..32) of shared memory (16-byte rows, lane l naming row l),
// transposed: lane (g, t) gets (row 8i + 2t, col g) and (row 8i + 2t + 1, col g) of matrix i.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* row) {
  const uint32_t at = (uint32_t)__cvta_generic_to_shared(row);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(at));
}

// Where lane p's W row of a slice (physical k = p) goes in the staged slice: its logical k.
__device__ __forceinline__ int logical_k(int p) {
  const int t = p >> 3, j = (p >> 2) & 1, q = p & 3;
  return 16 * j + 8 * (q >> 1) + 2 * t + (q & 1);
}

struct Words { uint32_t w[4]; };  // a 16-byte vector as four pairs of 16-bit elements

template <typename T, bool CONV1D, int NT>
__device__ void skinny(const T* x, const T* w, const T* b, T* y, int m, int n, int k, int act) {
  constexpr int COLS = 8 * NT;
  __shared__ float part[WARPS][16][COLS];
  __shared__ alignas(16) T stage[CONV1D ? WARPS : 1][32][COLS];
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
      for (int i = 0; i < NT; i++) {
        if (CONV1D) {  // W row 32s + lane, columns n0 + 8i..
          wv[u][i] = live ? *(const Words*)(w + (long)(s * 32 + lane) * n + n0 + 8 * i) : zero;
        } else {  // W row n0 + 8i + g, elements 32s + 8t..
          const int col = n0 + 8 * i + g;
          wv[u][i] = live && col < n ? *((const Words*)(w + (long)col * k + s * 32) + t) : zero;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < U; u++) {
      if (s0 + u * WARPS >= slices) break;  // the same for the whole warp
#pragma unroll
      for (int i = 0; i < NT; i++) {
        uint32_t bw[4];  // mma 0: bw[0], bw[1]; mma 1: bw[2], bw[3]
        if (CONV1D) {
          __syncwarp();  // the previous tile's ldmatrix is done with the stage
          *(Words*)&stage[CONV1D ? warp : 0][logical_k(lane)][8 * i] = wv[u][i];
          __syncwarp();
          ldmatrix_x4_trans(bw, &stage[CONV1D ? warp : 0][lane][8 * i]);
        } else {
#pragma unroll
          for (int r = 0; r < 4; r++) bw[r] = wv[u][i].w[r];
        }
#pragma unroll
        for (int j = 0; j < 2; j++) {
          const uint32_t a[4] = {va[u].w[2 * j], vb[u].w[2 * j], va[u].w[2 * j + 1], vb[u].w[2 * j + 1]};
          mma<T>(c[i], a, bw[2 * j], bw[2 * j + 1]);
        }
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
    float v = b ? to_f(b[col]) : 0.f;
#pragma unroll
    for (int s = 0; s < WARPS; s++) v += part[s][r][e % COLS];
    if (act == 1) v = 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    y[(long)r * n + col] = from_f<T>(v);
  }
}

#define SKINNY(T, S)                                                                                       \
  extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                 \
      tb_skinny_linear1_##S(const T* x, const T* w, const T* b, T* y, int m, int n, int k, int act) {     \
    skinny<T, false, 1>(x, w, b, y, m, n, k, act);                                                         \
  }                                                                                                        \
  extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                 \
      tb_skinny_linear2_##S(const T* x, const T* w, const T* b, T* y, int m, int n, int k, int act) {     \
    skinny<T, false, 2>(x, w, b, y, m, n, k, act);                                                         \
  }                                                                                                        \
  extern "C" __global__ void __launch_bounds__(32 * WARPS)                                                 \
      tb_skinny_conv1d_##S(const T* x, const T* w, const T* b, T* y, int m, int n, int k, int act) {      \
    skinny<T, true, 2>(x, w, b, y, m, n, k, act);                                                          \
  }
SKINNY(__nv_bfloat16, bf16)
SKINNY(__half, f16)
