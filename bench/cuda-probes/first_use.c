// Probe 7: what the kernel path's copies cost the first time, against
// later: ugds's copy engine (a green context over all SMs, 8 streams) makes
// one event per copy in flight, the first time that many are in flight, and
// pins each 2 MiB bounce slab when it is made. Measured in a green context,
// then in the primary context:
//   - N cuEventCreate one after another, twice (all destroyed in between):
//     the first, the median, the largest and the total;
//   - the first four 4 KiB copies (enqueue, record an event, poll it done)
//     on each of 8 new streams;
//   - cuMemHostRegister of four 2 MiB huge-page slabs.
//
//   nvcc -O2 -o first_use first_use.c -lcuda && ./first_use 256
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s: %s\n", #x, n); exit(1); } } while (0)
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static void events(const char *where, int n) {
    CUevent *ev = malloc(n * sizeof *ev);
    double *t = malloc(n * sizeof *t);
    for (int round = 1; round <= 2; round++) {
        double total = 0;
        for (int i = 0; i < n; i++) {
            double s = now_us();
            CK(cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
            t[i] = now_us() - s;
            total += t[i];
        }
        double first = t[0];
        qsort(t, n, sizeof *t, cmp);
        printf("%s, round %d: %d cuEventCreate: first %.1f us, p50 %.1f us, max %.1f us, total %.1f us\n", where, round, n,
               first, t[n / 2], t[n - 1], total);
        for (int i = 0; i < n; i++) CK(cuEventDestroy(ev[i]));
    }
    free(ev);
    free(t);
}

static void copies(const char *where, CUdeviceptr dst, const void *src) {
    CUevent e;
    CK(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    for (int i = 0; i < 8; i++) {
        CUstream s;
        double st = now_us();
        CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
        double made = now_us() - st;
        double t[4];
        for (int j = 0; j < 4; j++) {
            st = now_us();
            CK(cuMemcpyHtoDAsync(dst, src, 4096, s));
            CK(cuEventRecord(e, s));
            while (cuEventQuery(e) == CUDA_ERROR_NOT_READY) {}
            t[j] = now_us() - st;
        }
        printf("%s: stream %d made in %.1f us; its 4 KiB copies, enqueue to done: %.1f / %.1f / %.1f / %.1f us\n", where, i,
               made, t[0], t[1], t[2], t[3]);
    }
}

static void pins(const char *where) {
    for (int i = 0; i < 4; i++) {
        size_t len = 2 << 20;
        char *raw = mmap(NULL, 2 * len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (raw == MAP_FAILED) { perror("mmap"); exit(1); }
        char *slab = (char *)(((size_t)raw + len - 1) & ~(len - 1));
        madvise(slab, len, MADV_HUGEPAGE);
        double st = now_us();
        memset(slab, 0, len);
        double touched = now_us() - st;
        st = now_us();
        CK(cuMemHostRegister(slab, len, CU_MEMHOSTREGISTER_PORTABLE));
        printf("%s: 2 MiB slab %d: touched in %.1f us, cuMemHostRegister %.1f us\n", where, i, touched, now_us() - st);
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, 0, _IONBF, 0);
    int n = argc > 1 ? atoi(argv[1]) : 256;
    if (n < 1) n = 1;
    CUdevice dev;
    CUcontext pc;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&pc, dev));
    CK(cuCtxSetCurrent(pc));
    CUdeviceptr dst;
    CK(cuMemAlloc(&dst, 1 << 20));
    void *src;
    CK(cuMemHostAlloc(&src, 4096, CU_MEMHOSTALLOC_PORTABLE));
    double st = now_us();
    CUdevResource sm;
    CK(cuDeviceGetDevResource(dev, &sm, CU_DEV_RESOURCE_TYPE_SM));
    CUdevResourceDesc desc;
    CK(cuDevResourceGenerateDesc(&desc, &sm, 1));
    CUgreenCtx g;
    CK(cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
    CUcontext gc;
    CK(cuCtxFromGreenCtx(&gc, g));
    printf("green context made in %.1f us\n", now_us() - st);
    CK(cuCtxSetCurrent(gc));
    events("green context", n);
    copies("green context", dst, src);
    pins("green context");
    CK(cuCtxSetCurrent(pc));
    events("primary context", n);
    copies("primary context", dst, src);
    pins("primary context");
    return 0;
}
