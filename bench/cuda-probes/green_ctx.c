// Probe 6: a green context as the copy engine's context. How long it takes
// to create (against cuCtxCreate), and whether a copy on a stream of it runs
// while N streams of the primary context wait on a host word (as a copy from
// a context of ugds's own does; queue_sharing shows one of the primary
// context stalls from 8 waiting streams on).
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now_ms(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e3 + t.tv_nsec / 1e6; }
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s: %s\n", #x, n); exit(1); } } while (0)
extern CUresult ctx_create_v2(CUcontext *, unsigned, CUdevice) __asm__("cuCtxCreate_v2");

int main(int argc, char **argv) {
    setvbuf(stdout, 0, _IONBF, 0);
    int waiting = argc > 1 ? atoi(argv[1]) : 32;
    CUdevice dev; CUcontext pc;
    CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&pc, dev)); CK(cuCtxSetCurrent(pc));
    CUdeviceptr buf; CK(cuMemAlloc(&buf, 1 << 20));
    double t = now_ms();
    CUdevResource sm; CK(cuDeviceGetDevResource(dev, &sm, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResourceDesc desc; CK(cuDevResourceGenerateDesc(&desc, &sm, 1));
    CUgreenCtx g; CK(cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext gc; CK(cuCtxFromGreenCtx(&gc, g));
    double tg = now_ms() - t;
    t = now_ms();
    CUstream gs; CK(cuGreenCtxStreamCreate(&gs, g, CU_STREAM_NON_BLOCKING, 0));
    double tgs = now_ms() - t;
    t = now_ms(); CUcontext own; CK(ctx_create_v2(&own, 0, dev)); CUcontext popped; CK(cuCtxPopCurrent(&popped)); double tc = now_ms() - t;
    printf("green context (all SMs) %.3f ms, a stream of it %.3f ms; cuCtxCreate %.3f ms\n", tg, tgs, tc);
    CK(cuCtxSetCurrent(pc));
    volatile unsigned *word; CK(cuMemHostAlloc((void **)&word, 64, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)); *word = 0;
    CUdeviceptr dw; CK(cuMemHostGetDevicePointer(&dw, (void *)word, 0));
    void *pin; CK(cuMemHostAlloc(&pin, 4096, CU_MEMHOSTALLOC_PORTABLE));
    CUstream *ws = malloc(sizeof(CUstream) * waiting);
    for (int i = 0; i < waiting; i++) { CK(cuStreamCreate(&ws[i], CU_STREAM_NON_BLOCKING)); CK(cuStreamWaitValue32(ws[i], dw, 1, CU_STREAM_WAIT_VALUE_GEQ)); }
    // A copy on the green context's stream, with the primary context's
    // streams all waiting.
    CK(cuCtxSetCurrent(gc));
    CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    CK(cuMemcpyHtoDAsync(buf, pin, 4096, gs)); CK(cuEventRecord(ev, gs));
    t = now_ms(); while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY && now_ms() - t < 2000) {}
    printf("green context: a copy with %d primary-context streams waiting %s (%.3f ms)\n", waiting,
           cuEventQuery(ev) == CUDA_SUCCESS ? "ran" : "STALLED", now_ms() - t);
    *word = 1;
    CK(cuCtxSetCurrent(pc)); CK(cuCtxSynchronize());
    CK(cuCtxSetCurrent(gc)); CK(cuStreamSynchronize(gs));
    // The same from a context of its own, for reference.
    *word = 0;
    CK(cuCtxSetCurrent(pc));
    for (int i = 0; i < waiting; i++) CK(cuStreamWaitValue32(ws[i], dw, 2, CU_STREAM_WAIT_VALUE_GEQ));
    CK(cuCtxPushCurrent(own)); CUstream os; CK(cuStreamCreate(&os, CU_STREAM_NON_BLOCKING)); CUevent oe; CK(cuEventCreate(&oe, CU_EVENT_DISABLE_TIMING));
    CK(cuMemcpyHtoDAsync(buf, pin, 4096, os)); CK(cuEventRecord(oe, os));
    t = now_ms(); while (cuEventQuery(oe) == CUDA_ERROR_NOT_READY && now_ms() - t < 2000) {}
    printf("own context: a copy with %d primary-context streams waiting %s (%.3f ms)\n", waiting,
           cuEventQuery(oe) == CUDA_SUCCESS ? "ran" : "STALLED", now_ms() - t);
    CK(cuCtxPopCurrent(&popped));
    *word = 2;
    CK(cuCtxSynchronize());
    return 0;
}
