// Every kernel's GPU start and end, graphed ones included, from CUPTI's activity records: the
// GPU hosts have ncu (one kernel at a time, caches flushed) but no nsys, so how the decode
// step's kernels overlap inside its graph was never seen (docs/perf-notes.md).
//
// Loaded by the CUDA driver into any process (no change to the program traced):
//   CUDA_INJECTION64_PATH=$PWD/.gpu/libkernel_trace.so TB_KERNEL_TRACE=/tmp/k.csv /tmp/bench ...
// Writes one CSV line a kernel: name,start_ns,end_ns,graph_id,graph_node_id,correlation_id,
// grid_x,block_x,registers,stream_id. scripts/kernel_timeline.py reads it.
// CONCURRENT_KERNEL records do not serialise kernels (KERNEL records would).
// Built here: gcc -O2 -shared -fPIC -I$CUPTI/include scripts/probes/kernel_trace.c -o
// .gpu/libkernel_trace.so -L$CUPTI/lib -l:libcupti.so.13 (CUPTI 13.0's headers and library,
// the nvidia-cuda-cupti wheel; the host's driver is CUDA 13.0).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *out;
enum { BUFFER_BYTES = 8 << 20, ALIGN = 8 };

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  uint8_t *raw = malloc(BUFFER_BYTES + ALIGN);
  *buffer = raw ? (uint8_t *)(((uintptr_t)raw + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1)) : NULL;
  *size = raw ? BUFFER_BYTES : 0;
  *max_records = 0;  // as many as fit
}

// The buffer's kernel records as CSV lines; the buffer itself is leaked (its malloc'd start is
// lost to the alignment; a trace holds a few buffers).
static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
  (void)ctx, (void)stream, (void)size;
  CUpti_Activity *record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)record;
    fprintf(out, "%s,%llu,%llu,%u,%llu,%u,%d,%d,%u,%u\n", k->name, (unsigned long long)k->start,
            (unsigned long long)k->end, k->graphId, (unsigned long long)k->graphNodeId, k->correlationId,
            k->gridX, k->blockX, (unsigned)k->registersPerThread, k->streamId);
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(ctx, stream, &dropped) == CUPTI_SUCCESS && dropped)
    fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
}

static void flush_at_exit(void) {
  cuptiActivityFlushAll(1);
  if (out) fclose(out);
}

// Called by the driver when it loads the library (CUDA_INJECTION64_PATH).
int InitializeInjection(void) {
  const char *path = getenv("TB_KERNEL_TRACE");
  out = fopen(path ? path : "kernel_trace.csv", "w");
  if (!out) {
    perror("kernel_trace: TB_KERNEL_TRACE");
    return 0;
  }
  if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) {
    fprintf(stderr, "kernel_trace: CUPTI refused the kernel activity\n");
    return 0;
  }
  atexit(flush_at_exit);
  return 1;
}
