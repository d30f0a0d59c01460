// Probe 9: what a small transfer costs after the machine was idle, without
// a disk: each of (a) a 4 KiB memcpy on the CPU, (b) a 4 KiB
// cuMemcpyHtoDAsync from pinned memory and its stream's synchronize, (c) an
// empty kernel and its synchronize, after pauses of 0, 5 and 100 ms (ten
// each, the first two of each pause dropped). `ugds gpu-bench`'s first read
// and its reads after a pause cost 3-8x a read back to back, from the page
// cache too: whether the CPU or the GPU pays it after idling.
//
//   nvcc -O2 -o after_idle after_idle.c -lcuda && ./after_idle
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s: %s\n", #x, n); exit(1); } } while (0)
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static const char *ptx = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry nop(){ ret; }\n";

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CK(cuCtxSetCurrent(ctx));
    CUmodule mod;
    CUfunction nop;
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&nop, mod, "nop"));
    CUstream s;
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    void *host;
    CK(cuMemHostAlloc(&host, 1 << 20, 0));
    CUdeviceptr d;
    CK(cuMemAlloc(&d, 1 << 20));
    char *a = malloc(64 << 20), *b = malloc(4096);
    memset(a, 1, 64 << 20);
    const char *what[3] = {"cpu memcpy 4 KiB", "cuMemcpyHtoDAsync 4 KiB + sync", "empty kernel + sync"};
    int pauses_ms[3] = {0, 5, 100};
    for (int w = 0; w < 3; w++) {
        for (int p = 0; p < 3; p++) {
            double t[10];
            for (int i = 0; i < 10; i++) {
                if (pauses_ms[p]) {
                    struct timespec ts = {0, pauses_ms[p] * 1000000L};
                    nanosleep(&ts, 0);
                }
                double st = now_us();
                if (w == 0) {
                    memcpy(b, a + (size_t)(i * 7919 % 16384) * 4096, 4096);
                    __asm__ volatile("" ::"r"(b) : "memory");
                } else if (w == 1) {
                    CK(cuMemcpyHtoDAsync(d + (i % 256) * 4096, (char *)host + (i % 256) * 4096, 4096, s));
                    CK(cuStreamSynchronize(s));
                } else {
                    CK(cuLaunchKernel(nop, 1, 1, 1, 32, 1, 1, 0, s, 0, 0));
                    CK(cuStreamSynchronize(s));
                }
                t[i] = now_us() - st;
            }
            qsort(t + 2, 8, sizeof t[0], cmp);
            printf("%-32s after %3d ms idle: median %7.1f us, max %7.1f us\n", what[w], pauses_ms[p], (t[5] + t[6]) / 2, t[9]);
        }
    }
    return 0;
}
