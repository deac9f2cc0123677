// The greedy pick (#20) over the vocabulary, banned ids excluded: one block a row, or long rows
// in chunks and then the best of the chunks; launched by argmax.rs.
// Shapes: B rows (batch), V vocabulary.
#include "common.cuh"

// Greedy pick: the first index of the largest x[row, j] + ban[j] (ban: (V,) 0 or −inf, or
// null), one block per row. Two-level (warp, then block) reduction of (value, index) pairs,
// where candle's argmax over V = 50257 took 41 µs at batch 1.
//   x: (B, V); out: (B,) u32
__device__ __forceinline__ void better(float& v, int& i, float v2, int i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}
// The block's best (value, index) pair, in thread 0: warps, then the first warp.
__device__ __forceinline__ void block_best(float& best, int& idx) {
  __shared__ float sv[32];
  __shared__ int si[32];
  for (int o = 16; o > 0; o >>= 1)
    better(best, idx, __shfl_xor_sync(0xffffffff, best, o), __shfl_xor_sync(0xffffffff, idx, o));
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  if (lane == 0) {
    sv[w] = best;
    si[w] = idx;
  }
  __syncthreads();
  if (w == 0) {
    best = lane < nw ? sv[lane] : -INFINITY;
    idx = lane < nw ? si[lane] : 0x7fffffff;
    for (int o = 16; o > 0; o >>= 1)
      better(best, idx, __shfl_xor_sync(0xffffffff, best, o), __shfl_xor_sync(0xffffffff, idx, o));
  }
}

// Elements a thread loads before it compares them: one L2 round trip for a chunk of 2048 at 256
// threads, where loading each element then comparing it took eight (nvcc kept the loop rolled:
// the pick took 6.2 µs after BLOOM's head, results/h200/exp-run119's trace).
constexpr int PICK_UNROLL = 8;

// The best of x[lo..hi) + ban, in thread 0 (index 0x7fffffff where none won: NaN or −inf only).
template <typename T>
__device__ void argmax_range(const T* xr, const T* ban, int lo, int hi, float& best, int& idx) {
  best = -INFINITY;
  idx = 0x7fffffff;
  for (int j0 = lo + threadIdx.x; j0 < hi; j0 += PICK_UNROLL * blockDim.x) {
    T x[PICK_UNROLL], b[PICK_UNROLL];
#pragma unroll
    for (int u = 0; u < PICK_UNROLL; u++) {
      const int j = j0 + u * blockDim.x;
      x[u] = j < hi ? xr[j] : from_f<T>(0.f);
      b[u] = ban && j < hi ? ban[j] : from_f<T>(0.f);
    }
#pragma unroll
    for (int u = 0; u < PICK_UNROLL; u++) {
      const int j = j0 + u * blockDim.x;
      if (j >= hi) break;
      float val = to_f(x[u]);
      if (ban) val = to_f(from_f<T>(val + to_f(b[u])));
      better(best, idx, val, j);
    }
  }
  block_best(best, idx);
}

// The token record of a graphed decode (`--fused step-io`): the pick of the step at cache
// position *cursor (advanced by the step's first kernel) goes to column *cursor − base of its
// row; record null: none.
struct Record {
  uint32_t* tokens;  // (B, cols)
  const uint32_t* cursor;
  int base, cols;
};

// The record's column of this step's pick, in thread 0 (−1 without a record): read before the
// pick's loads, so that its round trip is not one more after the reduction.
__device__ __forceinline__ int record_column(Record rec) {
  return threadIdx.x == 0 && rec.tokens ? (int)*rec.cursor - rec.base : -1;
}

// Row `row`'s pick (thread 0's idx; 0x7fffffff where no index won: a row of NaN or −inf only,
// index 0) into out[row], and into the record's column `col` (record_column) where given.
__device__ __forceinline__ void write_pick(uint32_t* out, Record rec, int row, int idx, int col) {
  if (threadIdx.x != 0) return;
  const uint32_t id = idx == 0x7fffffff ? 0u : (uint32_t)idx;
  out[row] = id;
  if (rec.tokens && col >= 0 && col < rec.cols) rec.tokens[(long)row * rec.cols + col] = id;
}

// The record as the kernels take it: four arguments.
#define RECORD_ARGS uint32_t *rec_tokens, const uint32_t *rec_cursor, int rec_base, int rec_cols
#define RECORD Record{rec_tokens, rec_cursor, rec_base, rec_cols}

template <typename T>
__device__ void argmax_rows(const T* x, const T* ban, uint32_t* out, Record rec, int v) {
  const int col = record_column(rec);
  float best;
  int idx;
  argmax_range(x + (long)blockIdx.x * v, ban, 0, v, best, idx);
  write_pick(out, rec, blockIdx.x, idx, col);
}

// Long rows (BLOOM's V = 250880: one block a row took 108 µs) in two launches: block (c, row)
// takes the best of chunk c into (part_v, part_i)[row, c]; then tb_argmax_final picks each
// row's best of its chunks, the first index among equals as above.
//   part_v, part_i: (B, chunks); chunk: columns a block
template <typename T>
__device__ void argmax_part(const T* x, const T* ban, float* part_v, int* part_i, int v, int chunk) {
  const int c = blockIdx.x, row = blockIdx.y;
  const int lo = c * chunk, hi = min(v, lo + chunk);
  float best;
  int idx;
  argmax_range(x + (long)row * v, ban, lo, hi, best, idx);
  if (threadIdx.x == 0) {
    part_v[(long)row * gridDim.x + c] = best;
    part_i[(long)row * gridDim.x + c] = idx;
  }
}

// The best of row `row`'s chunks (the partials), in thread 0; `cg` reads them from L2 (the
// last chunk's block reads what the others wrote in this kernel).
template <bool CG>
__device__ void best_of_chunks(const float* part_v, const int* part_i, int row, int chunks, float& best, int& idx) {
  best = -INFINITY;
  idx = 0x7fffffff;
  for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
    const long o = (long)row * chunks + c;
    better(best, idx, CG ? __ldcg(part_v + o) : part_v[o], CG ? __ldcg(part_i + o) : part_i[o]);
  }
  block_best(best, idx);
}

// argmax_part, then the row's last chunk to finish (counted in counter[row], which it resets
// to 0) picks the best of the chunks itself (`--fused step-io`): one launch instead of two.
template <typename T>
__device__ void argmax_part_last(const T* x, const T* ban, float* part_v, int* part_i, int v, int chunk,
                                 uint32_t* counter, uint32_t* out, Record rec) {
  __shared__ bool last;
  const int col = record_column(rec);
  argmax_part<T>(x, ban, part_v, part_i, v, chunk);
  const int row = blockIdx.y;
  __threadfence();  // this chunk's partials before its count
  if (threadIdx.x == 0) last = atomicAdd(counter + row, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();  // every chunk's partials after the count
  float best;
  int idx;
  best_of_chunks<true>(part_v, part_i, row, gridDim.x, best, idx);
  write_pick(out, rec, row, idx, col);
  if (threadIdx.x == 0) counter[row] = 0;
}

extern "C" __global__ void tb_argmax_final(const float* part_v, const int* part_i, uint32_t* out, RECORD_ARGS,
                                           int chunks) {
  pdl_begin();
  const int col = record_column(RECORD);
  float best;
  int idx;
  best_of_chunks<false>(part_v, part_i, blockIdx.x, chunks, best, idx);
  write_pick(out, RECORD, blockIdx.x, idx, col);
}

#define INSTANTIATE(T, S)                                                                                     \
  extern "C" __global__ void tb_argmax_##S(const T* x, const T* ban, uint32_t* out, RECORD_ARGS, int v) {   \
    pdl_begin();                                                                                              \
    argmax_rows<T>(x, ban, out, RECORD, v);                                                                   \
  }                                                                                                           \
  extern "C" __global__ void tb_argmax_part_##S(const T* x, const T* ban, float* part_v, int* part_i, int v,  \
                                                int chunk) {                                                  \
    pdl_begin();                                                                                              \
    argmax_part<T>(x, ban, part_v, part_i, v, chunk);                                                         \
  }                                                                                                           \
  extern "C" __global__ void tb_argmax_part_last_##S(const T* x, const T* ban, float* part_v, int* part_i,    \
                                                     int v, int chunk, uint32_t* counter, uint32_t* out,      \
                                                     RECORD_ARGS) {                                           \
    pdl_begin();                                                                                              \
    argmax_part_last<T>(x, ban, part_v, part_i, v, chunk, counter, out, RECORD);                              \
  }
FOR_TYPES(INSTANTIATE)
