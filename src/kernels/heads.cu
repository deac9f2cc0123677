// The attention's head layout changes (#21), launched by heads.rs: candle's strided copy
// (`ucopy`) took 7.0 ms of gpt2's 46.8 ms training step for them, at about a sixth of the
// bandwidth. Each thread moves one 16-byte vector (8 bf16, 4 f32) of a head's row; a head's row
// (hs elements) is V such vectors, contiguous on both sides.
// Shapes: x (B, T, G, nh, hs) = a projection's output rows [part 0 | … | part G−1];
// parts (B, nh, T, hs), the batches of the attention matmuls.
#include "common.cuh"

// out (G, B, nh, T, hs) from x; i walks x in order (coalesced reads).
extern "C" __global__ void tb_split_heads(const uint4* x, uint4* out, int B, int T, int G, int nh, int V) {
  const long total = (long)B * T * G * nh * V, row = (long)G * nh * V;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long r = i / row, j = i % row;  // r = b·T + t
    const long g = j / (nh * V), h = (j / V) % nh, e = j % V, b = r / T, t = r % T;
    out[(((g * B + b) * nh + h) * T + t) * V + e] = x[i];
  }
}

// out (B, T, G, nh, hs) from the G parts (G ≤ 3; the unused pointers repeat p0); i walks out in
// order (coalesced writes).
extern "C" __global__ void tb_merge_heads(const uint4* p0, const uint4* p1, const uint4* p2, uint4* out, int B,
                                          int T, int G, int nh, int V) {
  const long total = (long)B * T * G * nh * V, row = (long)G * nh * V;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < total; i += (long)gridDim.x * blockDim.x) {
    const long r = i / row, j = i % row;
    const long g = j / (nh * V), h = (j / V) % nh, e = j % V, b = r / T, t = r % T;
    const uint4* p = g == 0 ? p0 : (g == 1 ? p1 : p2);
    out[i] = p[((b * nh + h) * T + t) * V + e];
  }
}
