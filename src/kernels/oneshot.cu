// One-shot sum over the GPUs of one host (#34): tensor parallelism's small all-reduces (a
// decode step's 60 sums of 8 KiB on bloom-7b1) cost NCCL ≈ 18 µs each, its latency floor. Here
// each rank pushes its values into every rank's receive buffer over NVLink (CUDA IPC, mapped
// by src/dist/peer_sum.rs) and sums the copies it receives in rank order, so every rank gets
// the same bits. One launch, no host, no barrier: each 16-byte line carries 8 bytes of values
// and the epoch twice (NCCL's LL protocol), so a receiver knows a line has arrived from the line
// itself (16-byte stores and loads are single copies), with no fence or flag round trip.
// Launched by oneshot.rs.
//
// Each rank's buffer (one cuMemAlloc, IPC-shared): COUNTERS [MAX_BLOCKS] u32 (this rank's epoch
// of each block; sender and receiver blocks of one index handle the same lines), then at DATA
// two slots (even and odd epochs) of [MAX_RANKS senders][2 · cap bytes of lines].
// Every kernel here runs a grid of exactly MAX_BLOCKS blocks, each of which advances its epoch
// once, so all counters move together: kernel k of a stream runs at epoch k + 1 in every
// block. (gemv_push, below, is the exception: it pushes at the next kernel's epoch and leaves
// the counters to that kernel, oneshot_add_layer_norm with pushed = 1.) (A grid sized to the tensor let the counters drift apart, and a block could then write
// lines another rank was still reading from an older epoch of the same parity.)
// Why two slots suffice without a barrier: a rank running kernel k has finished kernel k − 1,
// so it received every rank's lines of k − 1, which each rank sent after it had finished kernel
// k − 2, the last to read slot k % 2 (kernels of one stream run in order).
// Shapes: the sum's x, y (n,) contiguous, n · sizeof(T) whole 16-byte vectors, ≤ cap bytes;
// the fused sum + add + LayerNorm's x, r, s, y (rows, c), w and b (c,), c / (16 / sizeof(T))
// ≤ 1024 16-byte vectors a row (one a thread).
#include "gemv.cuh"

#define MAX_RANKS 8
#define MAX_BLOCKS 32
#define COUNTERS 0
#define DATA 4096

// A line: two 4-byte words of values, each beside the epoch that sent it.
struct __align__(16) Line {
  uint32_t data1, flag1, data2, flag2;
};

__device__ __forceinline__ void store_line(Line* p, uint32_t d1, uint32_t d2, uint32_t epoch) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(d1), "r"(epoch), "r"(d2),
               "r"(epoch)
               : "memory");
}

__device__ __forceinline__ Line load_line(const Line* p) {
  Line l;
  asm volatile("ld.volatile.global.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(l.data1), "=r"(l.flag1), "=r"(l.data2), "=r"(l.flag2)
               : "l"(p)
               : "memory");
  return l;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The line of this epoch at `p`, once it has arrived. A rank that never sends (it died) would
// hang the stream: after 60 s the kernel traps, which fails the run with a CUDA error.
__device__ Line receive(const Line* p, uint32_t epoch, unsigned rank, unsigned from) {
  Line l = load_line(p);
  if (l.flag1 == epoch && l.flag2 == epoch) return l;
  const unsigned long long start = now_ns();
  for (;;) {
    l = load_line(p);
    if (l.flag1 == epoch && l.flag2 == epoch) return l;
    if (now_ns() - start > 60ull * 1000 * 1000 * 1000) {
      printf("one-shot sum: rank %u waited 60 s for rank %u (did it fail?)\n", rank, from);
      __trap();
    }
  }
}

// Adds the values of a 4-byte word to acc (4 / sizeof(T) of them).
template <typename T>
__device__ __forceinline__ void add_word(float* acc, uint32_t w) {
  constexpr int E = 4 / sizeof(T);
  const T* v = (const T*)&w;
#pragma unroll
  for (int j = 0; j < E; j++) acc[j] += to_f(v[j]);
}

template <typename T>
__device__ __forceinline__ uint32_t round_word(const float* acc) {
  constexpr int E = 4 / sizeof(T);
  uint32_t w;
  T* v = (T*)&w;
#pragma unroll
  for (int j = 0; j < E; j++) v[j] = from_f<T>(acc[j]);
  return w;
}

// This block's epoch, one more than its previous kernel's (all threads read it).
__device__ __forceinline__ uint32_t next_epoch(uint32_t* counter) {
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = *counter + 1;
  __syncthreads();
  return epoch_s;
}

// The first line of sender `from`'s run in slot `epoch % 2` of the buffer at `base`.
__device__ __forceinline__ Line* run_of(char* base, uint32_t epoch, unsigned from, unsigned cap) {
  const size_t run = 2 * (size_t)cap;
  return (Line*)(base + DATA + (size_t)(epoch & 1) * MAX_RANKS * run + from * run);
}

template <typename T>
__device__ void oneshot_sum(const uint2* x, uint2* y, long lines, const unsigned long long* bases, unsigned rank,
                            unsigned world, unsigned cap) {
  constexpr int E = 4 / sizeof(T);
  char* own = (char*)bases[rank];
  uint32_t* counter = (uint32_t*)(own + COUNTERS) + blockIdx.x;
  const uint32_t epoch = next_epoch(counter);
  // This block's lines: the same on every rank (same n, same grid).
  const long per = (lines + gridDim.x - 1) / gridDim.x;
  const long lo = blockIdx.x * per, hi = min(lines, lo + per);

  // Push: my 8 bytes of line i into my run of every rank's slot.
  for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const uint2 v = x[i];
    for (unsigned r = 0; r < world; r++) store_line(run_of((char*)bases[r], epoch, rank, cap) + i, v.x, v.y, epoch);
  }
  // Receive and sum, in rank order, f32 inside, one rounding.
  for (long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float a1[E], a2[E];
#pragma unroll
    for (int j = 0; j < E; j++) a1[j] = a2[j] = 0.f;
    for (unsigned r = 0; r < world; r++) {
      const Line l = receive(run_of(own, epoch, r, cap) + i, epoch, rank, r);
      add_word<T>(a1, l.data1);
      add_word<T>(a2, l.data2);
    }
    y[i] = make_uint2(round_word<T>(a1), round_word<T>(a2));
  }
  __syncthreads();
  if (threadIdx.x == 0) *counter = epoch;
}

// The sum over the ranks of x (a row-parallel projection's partial output), added to the
// residual r, and the LayerNorm of that: s = r + Σ x and y = LN(s), a block a row (rows
// blockIdx.x, + gridDim.x, …), a 16-byte vector (two lines) a thread. Bit for bit what the
// one-shot sum and then add_layer_norm_vec (layer_norm.cu) give with the same block size: the
// sum rounded to T, the add rounded to T, the statistics in f32 by the same block reductions.
// pushed: every rank's x already sits in the buffers (gemv_push made and pushed it); x unused.
template <typename T>
__device__ void oneshot_add_layer_norm(const uint4* x, const T* r, const T* w, const T* b, T* s, T* y, int rows,
                                       int c, float eps, const unsigned long long* bases, unsigned rank,
                                       unsigned world, unsigned cap, int pushed) {
  constexpr int N = 16 / sizeof(T), E = 4 / sizeof(T);
  __shared__ float sh[32];
  char* own = (char*)bases[rank];
  uint32_t* counter = (uint32_t*)(own + COUNTERS) + blockIdx.x;
  const uint32_t epoch = next_epoch(counter);
  const int vecs = c / N;
  const bool mine = threadIdx.x < vecs;
  // Push every row of the block first, so the receives below wait on nothing of ours.
  if (mine && !pushed)
    for (int row = blockIdx.x; row < rows; row += gridDim.x) {
      const long v = (long)row * vecs + threadIdx.x;
      const uint4 q = x[v];
      for (unsigned k = 0; k < world; k++) {
        Line* dst = run_of((char*)bases[k], epoch, rank, cap) + 2 * v;
        store_line(dst, q.x, q.y, epoch);
        store_line(dst + 1, q.z, q.w, epoch);
      }
    }
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {  // the same count for every thread
    const long v = (long)row * vecs + threadIdx.x;
    float val[N], sum = 0.f;
    Vec16<T> wv, bv;
    if (mine) {
      float acc[N];
#pragma unroll
      for (int i = 0; i < N; i++) acc[i] = 0.f;
      for (unsigned k = 0; k < world; k++) {
        const Line* src = run_of(own, epoch, k, cap) + 2 * v;
        const Line l1 = receive(src, epoch, rank, k), l2 = receive(src + 1, epoch, rank, k);
        add_word<T>(acc, l1.data1);
        add_word<T>(acc + E, l1.data2);
        add_word<T>(acc + 2 * E, l2.data1);
        add_word<T>(acc + 3 * E, l2.data2);
      }
      const Vec16<T> rv = *reinterpret_cast<const Vec16<T>*>(r + v * N);
      Vec16<T> sv;
#pragma unroll
      for (int i = 0; i < N; i++) {
        sv.e[i] = from_f<T>(to_f(rv.e[i]) + to_f(from_f<T>(acc[i])));
        val[i] = to_f(sv.e[i]);
        sum += val[i];
      }
      *reinterpret_cast<Vec16<T>*>(s + v * N) = sv;
      wv = *reinterpret_cast<const Vec16<T>*>(w + threadIdx.x * N);
      bv = *reinterpret_cast<const Vec16<T>*>(b + threadIdx.x * N);
    }
    const float mean = block_sum(sum, sh) / c;
    float var = 0.f;
    if (mine)
#pragma unroll
      for (int i = 0; i < N; i++) var += (val[i] - mean) * (val[i] - mean);
    const float rstd = rsqrtf(block_sum(var, sh) / c + eps);
    if (mine) {
      Vec16<T> yv;
#pragma unroll
      for (int i = 0; i < N; i++) yv.e[i] = from_f<T>((val[i] - mean) * rstd * to_f(wv.e[i]) + to_f(bv.e[i]));
      *reinterpret_cast<Vec16<T>*>(y + v * N) = yv;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) *counter = epoch;
}

// y = x Wᵀ + b at M <= 4 rows (gemv.cuh), pushed into every rank's buffer as the blocks finish
// it, for oneshot_add_layer_norm(pushed = 1) to receive: a tensor-parallel decode step's
// row-parallel projection and its sum's push in one kernel, the values crossing NVLink while
// the GEMV's last blocks still run (#34). Word j of y (values 2j, 2j + 1, flat) travels with
// the epoch as one 8-byte store at byte 8j of this rank's run: half a line, where and as
// oneshot_add_layer_norm's own push puts it, so the receiver is unchanged. The epoch is the
// next kernel's (counters equal in every block, see above); this kernel leaves the counters
// alone, the receiving kernel advances them. n even; 16-bit T (two values a word).
template <typename T, int M>
__device__ void gemv_push(const Vec16<T>* x, const Vec16<T>* w, const T* b, int n, int kv,
                          const unsigned long long* bases, unsigned rank, unsigned world, unsigned cap) {
  static_assert(sizeof(T) == 2 && COLS == 2, "a word is one value of each of the block's two columns");
  __shared__ float part[COLS][SPLIT][M];
  __shared__ uint32_t epoch_s;
  if (threadIdx.x == 0) epoch_s = *(volatile uint32_t*)((char*)bases[rank] + COUNTERS) + 1;
  gemv_parts<T, M>(x, w, n, kv, part);  // its __syncthreads() publishes epoch_s
  if (threadIdx.x >= 32) return;
  // Lane 2m + local finishes row m of column `local`; lane 2m packs the row's word.
  const int lane = threadIdx.x, m = lane / COLS, local = lane % COLS, col = blockIdx.x * COLS + local;
  float v = 0.f;
  if (m < M && col < n) v = gemv_finish<M>(part, local, m, to_f(b[col]), 0);
  const float right = __shfl_down_sync(0xffffffff, v, 1);
  if (m >= M || local != 0 || col >= n) return;
  union {
    T v[2];
    uint32_t u;
  } word;
  word.v[0] = from_f<T>(v);
  word.v[1] = from_f<T>(right);
  const uint32_t epoch = epoch_s;
  const unsigned long long line = (unsigned long long)epoch << 32 | word.u;
  const long at = ((long)m * n + col) / 2;  // the word's index
  for (unsigned k = 0; k < world; k++) {
    char* dst = (char*)run_of((char*)bases[k], epoch, rank, cap) + 8 * at;
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(dst), "l"(line) : "memory");
  }
}

// x += the peer's values, which its copy engine wrote into this rank's pair region (the
// two-GPU sum of src/dist/pair_sum.rs; the stream waited for their flag first). Read at L2
// (ld.global.cg): another GPU wrote them. Shapes: x, recv (n,).
template <typename T>
__device__ void pair_add(T* x, const T* recv, long n) {
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
    x[i] = from_f<T>(to_f(x[i]) + to_f(__ldcg(recv + i)));
}

// The pair sum's flags (src/dist/pair_sum.rs), one thread each: wait until this GPU's `flag`,
// which the other GPU writes, reaches `epoch` (a wrapping compare; trap after 60 s, as
// receive() does); write `epoch` to the other GPU's `flag` after this stream's earlier work.
extern "C" __global__ void tb_pair_wait(const unsigned* flag, unsigned epoch) {
  const unsigned long long start = now_ns();
  for (;;) {
    unsigned v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if ((int)(v - epoch) >= 0) return;
    if (now_ns() - start > 60ull * 1000 * 1000 * 1000) {
      printf("pair sum: waited 60 s for the other GPU (did it fail?)\n");
      __trap();
    }
  }
}

extern "C" __global__ void tb_pair_signal(unsigned* flag, unsigned epoch) {
  __threadfence_system();
  asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(flag), "r"(epoch) : "memory");
}

#define INSTANTIATE(T, S)                                                                                  \
  extern "C" __global__ void tb_oneshot_sum_##S(const uint2* x, uint2* y, long lines,                    \
                                                const unsigned long long* bases, unsigned rank,            \
                                                unsigned world, unsigned cap) {                            \
    oneshot_sum<T>(x, y, lines, bases, rank, world, cap);                                                  \
  }                                                                                                        \
  extern "C" __global__ void tb_oneshot_add_layer_norm_##S(                                                \
      const uint4* x, const T* r, const T* w, const T* b, T* s, T* y, int rows, int c, float eps,         \
      const unsigned long long* bases, unsigned rank, unsigned world, unsigned cap, int pushed) {          \
    oneshot_add_layer_norm<T>(x, r, w, b, s, y, rows, c, eps, bases, rank, world, cap, pushed);            \
  }                                                                                                        \
  extern "C" __global__ void tb_pair_add_##S(T* x, const T* recv, long n) { pair_add<T>(x, recv, n); }
FOR_TYPES(INSTANTIATE)

#define INSTANTIATE_PUSH_M(T, S, M)                                                                       \
  extern "C" __global__ void tb_gemv_push##M##_##S(const Vec16<T>* x, const Vec16<T>* w, const T* b, int n, \
                                                   int kv, const unsigned long long* bases, unsigned rank,  \
                                                   unsigned world, unsigned cap) {                          \
    gemv_push<T, M>(x, w, b, n, kv, bases, rank, world, cap);                                               \
  }
#define INSTANTIATE_PUSH(T, S) \
  INSTANTIATE_PUSH_M(T, S, 1) INSTANTIATE_PUSH_M(T, S, 2) INSTANTIATE_PUSH_M(T, S, 3) INSTANTIATE_PUSH_M(T, S, 4)
INSTANTIATE_PUSH(__nv_bfloat16, bf16)
INSTANTIATE_PUSH(__half, f16)
