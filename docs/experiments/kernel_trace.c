// A CUDA injection library that writes every kernel, copy and fill the GPU ran (graph nodes
// and NCCL's kernels included, each with its stream, graph and node ids and its start and end)
// and the host's graph launches and synchronizations, as CSV, one file per process.
//
// Why: the machines have no Nsight Systems, and the two-GPU step's overhead (about 35 us a
// step over one GPU) has to be placed on a timeline: which node starts late, which NCCL kernel
// waits, how far apart the ranks' hosts launch. CUPTI's activity records carry GPU timestamps
// in the host's time base, so the ranks' files share one clock.
//
// Build (on the GPU machine; CUPTI comes with PyTorch's pip packages):
//   C=$(python3 -c 'import nvidia.cu13,os;print(os.path.dirname(nvidia.cu13.__file__))')
//   gcc -O2 -shared -fPIC -o libkernel_trace.so kernel_trace.c -I$C/include
//       -I/usr/local/cuda/include -L$C/lib -l:libcupti.so.13 -Wl,-rpath,$C/lib (one line)
// Run: CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KERNEL_TRACE_DIR=/tmp/tr program ...
// Analyse: docs/experiments/kernel_trace.py /tmp/tr
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static FILE *out;

#define ALIGN 8
#define BUFFER (8u << 20)

static void CUPTIAPI requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  uint8_t *raw = (uint8_t *)malloc(BUFFER + ALIGN);
  *buffer = raw ? (uint8_t *)(((uintptr_t)raw + ALIGN - 1) & ~(uintptr_t)(ALIGN - 1)) : NULL;
  *size = raw ? BUFFER : 0;
  *max_records = 0;
}

// Only the driver calls that place a step on the host's clock are kept.
static int kept_api(CUpti_CallbackId cbid) {
  return cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch ||
         cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz ||
         cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize ||
         cbid == CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize;
}

/// One CSV row: type, device, stream, graph, node, start, end, correlation, extra, name.
static void row(char type, uint32_t device, uint32_t stream, uint32_t graph, uint64_t node,
                uint64_t start, uint64_t end, uint32_t correlation, uint64_t extra,
                const char *name) {
  fprintf(out, "%c,%u,%u,%u,%llu,%llu,%llu,%u,%llu,%s\n", type, device, stream, graph,
          (unsigned long long)node, (unsigned long long)start, (unsigned long long)end,
          correlation, (unsigned long long)extra, name);
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                               size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  char name[32];
  while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
    case CUPTI_ACTIVITY_KIND_KERNEL: {
      CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)record;
      row('K', k->deviceId, k->streamId, k->graphId, k->graphNodeId, k->start, k->end,
          k->correlationId, (uint64_t)k->gridX * k->gridY * k->gridZ, k->name);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
      CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
      snprintf(name, sizeof name, "memcpy%u", m->copyKind);
      row('C', m->deviceId, m->streamId, m->graphId, m->graphNodeId, m->start, m->end,
          m->correlationId, m->bytes, name);
      break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
      CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
      row('S', m->deviceId, m->streamId, m->graphId, m->graphNodeId, m->start, m->end,
          m->correlationId, m->bytes, "memset");
      break;
    }
    case CUPTI_ACTIVITY_KIND_DRIVER: {
      CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)record;
      if (kept_api(a->cbid)) {
        snprintf(name, sizeof name, "api%u", a->cbid);
        row('A', 0, 0, 0, 0, a->start, a->end, a->correlationId, a->threadId, name);
      }
      break;
    }
    default:
      break;
    }
  }
  free(buffer); // the aligned pointer is the malloc'd one whenever malloc aligns to 8
}

static void flush(void) {
  cuptiActivityFlushAll(1);
  if (out)
    fclose(out);
  out = NULL;
}

int InitializeInjection(void) {
  const char *dir = getenv("KERNEL_TRACE_DIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/trace-%d.csv", dir ? dir : ".", (int)getpid());
  out = fopen(path, "w");
  if (!out)
    return 0;
  fprintf(out, "type,device,stream,graph,node,start,end,correlation,extra,name\n");
  if (cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS)
    return 0;
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
  atexit(flush);
  return 1;
}
