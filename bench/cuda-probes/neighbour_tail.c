// Probe 8: where the tail of `ugds gpu-bench`'s neighbour figure comes from
// with one or a few streams waiting on I/O (about 200 us at p99 on an H100,
// whatever CUDA_DEVICE_MAX_CONNECTIONS says, against 8 us at p50). A kernel
// that returns at once is launched on a stream of its own and synchronized,
// 2000 times, while STREAMS other threads (1 unless given) each keep a
// stream of their own busy with one of:
//   idle        nothing
//   wait        a wait on a host word (cuStreamWaitValue32) that the thread
//               releases IO_US later, then a write the thread waits for: a
//               stream-ordered read's wait without its copy
//   copykernel  ugds's staging copy's shape: a BLOCKS x 256 kernel (64
//               unless given) copying 1 MiB from device-mapped host memory,
//               back to back
//   memcpy      cuMemcpyHtoDAsync of 1 MiB, back to back
//   wait+copy   the wait, then the copy kernel: what a staged read does
//   ugds-shape  what ugds enqueues per staged read: the write of `reach`,
//               the wait, a 24-byte copy of the header into device memory,
//               the copy kernel with ugds's loop (four loads in flight per
//               thread), the write of `passed`; DEPTH (env, 1 unless given)
//               operations kept enqueued ahead, one released every IO_US
// and prints p50, p99 and the largest launch-to-end time of each.
//
//   nvcc -O2 -o neighbour_tail neighbour_tail.c -lcuda -lpthread && ./neighbour_tail 500 [STREAMS [BLOCKS]]
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static void spin_us(double us) { double e = now_us() + us; while (now_us() < e) {} }
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s: %s\n", #x, n); exit(1); } } while (0)
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

static const char *ptx =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry probe_nop(.param .u64 p){ ret; }\n"
    ".visible .entry probe_copy(.param .u64 dst, .param .u64 src, .param .u64 n16){\n"
    " .reg .pred %p<2>; .reg .b32 %r<9>; .reg .b64 %rd<13>;\n"
    " ld.param.u64 %rd2, [dst]; ld.param.u64 %rd3, [src]; ld.param.u64 %rd9, [n16];\n"
    " mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x; mov.u32 %r4, %nctaid.x;\n"
    " mul.wide.u32 %rd5, %r1, %r2; cvt.u64.u32 %rd6, %r3; add.u64 %rd5, %rd5, %rd6; mul.wide.u32 %rd7, %r4, %r2;\n"
    "WIDE:\n"
    " setp.ge.u64 %p1, %rd5, %rd9; @%p1 bra DONE;\n"
    " shl.b64 %rd10, %rd5, 4; add.u64 %rd11, %rd3, %rd10; add.u64 %rd12, %rd2, %rd10;\n"
    " ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd11]; st.global.v4.u32 [%rd12], {%r5, %r6, %r7, %r8};\n"
    " add.u64 %rd5, %rd5, %rd7; bra WIDE;\n"
    "DONE:\n ret;\n}\n"
    // ugds's staging copy's loop: four 16-byte loads in flight per thread
    // (a grid of 2^k blocks divides the 1 MiB; no remainder is copied).
    ".visible .entry probe_copy4(.param .u64 dst, .param .u64 src, .param .u64 n16){\n"
    " .reg .pred %p<2>; .reg .b32 %r<21>; .reg .b64 %rd<24>;\n"
    " ld.param.u64 %rd2, [dst]; ld.param.u64 %rd3, [src]; ld.param.u64 %rd9, [n16];\n"
    " mov.u32 %r1, %ctaid.x; mov.u32 %r2, %ntid.x; mov.u32 %r3, %tid.x; mov.u32 %r4, %nctaid.x;\n"
    " mul.wide.u32 %rd5, %r1, %r2; cvt.u64.u32 %rd6, %r3; add.u64 %rd5, %rd5, %rd6; mul.wide.u32 %rd7, %r4, %r2;\n"
    " shl.b64 %rd13, %rd7, 4; mul.lo.u64 %rd14, %rd7, 3; shl.b64 %rd15, %rd7, 2;\n"
    "WIDE4:\n"
    " add.u64 %rd16, %rd5, %rd14; setp.ge.u64 %p1, %rd16, %rd9; @%p1 bra DONE;\n"
    " shl.b64 %rd10, %rd5, 4; add.u64 %rd11, %rd3, %rd10; add.u64 %rd17, %rd11, %rd13; add.u64 %rd18, %rd17, %rd13; add.u64 %rd19, %rd18, %rd13;\n"
    " ld.global.v4.u32 {%r5, %r6, %r7, %r8}, [%rd11]; ld.global.v4.u32 {%r9, %r10, %r11, %r12}, [%rd17];\n"
    " ld.global.v4.u32 {%r13, %r14, %r15, %r16}, [%rd18]; ld.global.v4.u32 {%r17, %r18, %r19, %r20}, [%rd19];\n"
    " add.u64 %rd12, %rd2, %rd10; add.u64 %rd20, %rd12, %rd13; add.u64 %rd21, %rd20, %rd13; add.u64 %rd22, %rd21, %rd13;\n"
    " st.global.v4.u32 [%rd12], {%r5, %r6, %r7, %r8}; st.global.v4.u32 [%rd20], {%r9, %r10, %r11, %r12};\n"
    " st.global.v4.u32 [%rd21], {%r13, %r14, %r15, %r16}; st.global.v4.u32 [%rd22], {%r17, %r18, %r19, %r20};\n"
    " add.u64 %rd5, %rd5, %rd15; bra WIDE4;\n"
    "DONE:\n ret;\n}\n";

enum { IDLE, WAIT, COPYKERNEL, MEMCPY, WAIT_COPY, UGDS_SHAPE, MODES };
static const char *names[MODES] = {"idle", "wait", "copykernel", "memcpy", "wait+copy", "ugds-shape"};

enum { MAX_STREAMS = 32 };

/// One busy stream and what it works on.
struct busy {
    CUstream s;
    CUdeviceptr dst, src_dev, word_dev, passed_dev, reach_dev, hdr_dev, hdr_twin;
    void *src_host;
    volatile unsigned *word, *passed;
};

static struct {
    CUcontext ctx;
    CUfunction copy, copy4;
    unsigned blocks;
    double io_us;
    int mode;
    unsigned depth;
    volatile int stop;
} g;

static void *busy(void *arg) {
    struct busy *b = arg;
    CK(cuCtxSetCurrent(g.ctx));
    unsigned n = 0;
    unsigned long long n16 = (1 << 20) / 16;
    void *kp[] = {&b->dst, &b->src_dev, &n16};
    if (g.mode == UGDS_SHAPE) {
        // The copy kernel reads dst, src, len from the header's twin here;
        // this kernel takes them as parameters, the twin is copied anyway.
        unsigned enq = 0, rel = 0;
        while (!g.stop || rel < enq) {
            while (enq - rel < g.depth && !g.stop) {
                enq++;
                CK(cuStreamWriteValue32(b->s, b->reach_dev, enq, CU_STREAM_WRITE_VALUE_DEFAULT));
                CK(cuStreamWaitValue32(b->s, b->word_dev, enq, CU_STREAM_WAIT_VALUE_GEQ));
                CK(cuMemcpyAsync(b->hdr_twin, b->hdr_dev, 24, b->s));
                CK(cuLaunchKernel(g.copy4, g.blocks, 1, 1, 256, 1, 1, 0, b->s, kp, 0));
                CK(cuStreamWriteValue32(b->s, b->passed_dev, enq, CU_STREAM_WRITE_VALUE_DEFAULT));
            }
            if (rel < enq) {
                spin_us(g.io_us);
                *b->word = ++rel;
            }
        }
        while (*b->passed != rel) {}
        return 0;
    }
    while (!g.stop) {
        int waits = g.mode == WAIT || g.mode == WAIT_COPY;
        if (waits) CK(cuStreamWaitValue32(b->s, b->word_dev, ++n, CU_STREAM_WAIT_VALUE_GEQ));
        if (g.mode == COPYKERNEL || g.mode == WAIT_COPY) CK(cuLaunchKernel(g.copy, g.blocks, 1, 1, 256, 1, 1, 0, b->s, kp, 0));
        if (g.mode == MEMCPY) CK(cuMemcpyHtoDAsync(b->dst, b->src_host, 1 << 20, b->s));
        if (waits) {
            CK(cuStreamWriteValue32(b->s, b->passed_dev, n, CU_STREAM_WRITE_VALUE_DEFAULT));
            spin_us(g.io_us);
            *b->word = n;
            while (*b->passed != n && !g.stop) {}
        } else if (g.mode != IDLE) {
            CK(cuStreamSynchronize(b->s));
        } else {
            spin_us(100);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, 0, _IONBF, 0);
    g.io_us = argc > 1 ? atof(argv[1]) : 500;
    int streams = argc > 2 ? atoi(argv[2]) : 1;
    g.blocks = argc > 3 ? (unsigned)atoi(argv[3]) : 64;
    g.depth = getenv("DEPTH") ? (unsigned)atoi(getenv("DEPTH")) : 1;
    if (streams < 1 || streams > MAX_STREAMS || g.blocks < 1 || g.depth < 1) {
        printf("usage: neighbour_tail IO_US [STREAMS (1-%d) [BLOCKS]]\n", MAX_STREAMS);
        return 2;
    }
    CUdevice dev;
    CK(cuInit(0));
    CK(cuDeviceGet(&dev, 0));
    CK(cuDevicePrimaryCtxRetain(&g.ctx, dev));
    CK(cuCtxSetCurrent(g.ctx));
    CUmodule mod;
    CUfunction nop;
    CK(cuModuleLoadData(&mod, ptx));
    CK(cuModuleGetFunction(&nop, mod, "probe_nop"));
    CK(cuModuleGetFunction(&g.copy, mod, "probe_copy"));
    CK(cuModuleGetFunction(&g.copy4, mod, "probe_copy4"));
    CUstream k;
    CK(cuStreamCreate(&k, CU_STREAM_NON_BLOCKING));
    static struct busy b[MAX_STREAMS];
    for (int i = 0; i < streams; i++) {
        CK(cuStreamCreate(&b[i].s, CU_STREAM_NON_BLOCKING));
        CK(cuMemAlloc(&b[i].dst, 1 << 20));
        CK(cuMemHostAlloc(&b[i].src_host, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
        CK(cuMemHostGetDevicePointer(&b[i].src_dev, b[i].src_host, 0));
        CK(cuMemHostAlloc((void **)&b[i].word, 128, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
        b[i].passed = b[i].word + 16;
        *b[i].word = 0;
        *b[i].passed = 0;
        CK(cuMemHostGetDevicePointer(&b[i].word_dev, (void *)b[i].word, 0));
        b[i].passed_dev = b[i].word_dev + 64;
        b[i].reach_dev = b[i].word_dev + 96;
        b[i].hdr_dev = b[i].src_dev;
        CK(cuMemAlloc(&b[i].hdr_twin, 64));
    }
    CUdeviceptr scratch;
    CK(cuMemAlloc(&scratch, 64));
    void *np[] = {&scratch};
    enum { N = 2000 };
    static double t[N];
    for (int mode = 0; mode < MODES; mode++) {
        g.mode = mode;
        g.stop = 0;
        pthread_t th[MAX_STREAMS];
        for (int i = 0; i < streams; i++) pthread_create(&th[i], 0, busy, &b[i]);
        spin_us(20000);
        for (int i = 0; i < N; i++) {
            double st = now_us();
            CK(cuLaunchKernel(nop, 1, 1, 1, 32, 1, 1, 0, k, np, 0));
            CK(cuStreamSynchronize(k));
            t[i] = now_us() - st;
        }
        // Each thread releases its waits itself before it looks at
        // `stop`: none is left pending.
        g.stop = 1;
        for (int i = 0; i < streams; i++) {
            pthread_join(th[i], 0);
            CK(cuStreamSynchronize(b[i].s));
            *b[i].word = 0;
            *b[i].passed = 0;
        }
        qsort(t, N, sizeof t[0], cmp);
        printf("%-10s (%d stream(s), I/O %.0f us, %u blocks, depth %u): kernel launch to end p50 %.1f us, p99 %.1f us, max %.1f us\n",
               names[mode], streams, g.io_us, g.blocks, mode == UGDS_SHAPE ? g.depth : 1, t[N / 2], t[N * 99 / 100], t[N - 1]);
    }
    return 0;
}
