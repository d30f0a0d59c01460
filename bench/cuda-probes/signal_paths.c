// Probe 5: what a stream-ordered operation's hand-offs cost, by path, and
// what the set-up calls cost.
//
//   nvcc -O2 -o signal_paths signal_paths.c -lcuda -lpthread && ./signal_paths 1000 35
//
// Each path runs N operations back to back on one stream and prints the
// mean per operation (enqueue all, then synchronize), with a host thread
// playing the I/O that takes IO_US microseconds:
//   hostfn       a host function sets the done word itself (no I/O)
//   hostfn+io    a host function hands the operation to a worker thread
//                (a condition variable), which spins IO_US and sets done
//   reach+io     no host function: the stream writes "reached = n" to a
//                host word, a worker polling it spins IO_US and sets done
//   reach+io+k   the same, with a 1-block kernel after each wait
//   +one line    the same with the three words in one cache line
//   +64x256 k    a 64 x 256 kernel after the wait
//   +host hdr k  a kernel that reads a 24-byte header from device-mapped
//                host memory (as ugds's staging copy kernel did)
//   +dev hdr k   the same header in device memory
//   +dev hdr 4k  ... copying 4 KiB from device-mapped host memory
//   +hdr copy k  the host header copied to device memory on the stream
//                (cuMemcpyHtoDAsync) before the kernel
// and then, for waits of several lengths, the time from the host's store
// of `done` to the host seeing the stream's next write (the GPU's poll
// latency on a host word after a wait of that length), for a host word and
// for a device word copied there from another context.
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e6 + t.tv_nsec / 1e3; }
static void spin_us(double us) { double e = now_us() + us; while (now_us() < e) {} }
// CUDA 13's cuda.h maps cuCtxCreate to _v4; the library still has _v2.
extern CUresult ctx_create_v2(CUcontext *, unsigned, CUdevice) __asm__("cuCtxCreate_v2");
#define CK(x) do { CUresult r_ = (x); if (r_) { const char *n; cuGetErrorName(r_, &n); printf("%s: %s\n", #x, n); exit(1); } } while (0)

static volatile unsigned *words; // [0] done, [16] reached, [32] passed
static CUdeviceptr dwords;
static double io_us;
static volatile int stop;
static int reach_idx = 16; // the word the poller watches: 16 (its own line) or 2 (done's line)

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static unsigned queued;
static void hf_direct(void *d) { __atomic_store_n(&words[0], (unsigned)(size_t)d, __ATOMIC_RELEASE); }
static void hf_handoff(void *d) { pthread_mutex_lock(&mu); queued = (unsigned)(size_t)d; pthread_cond_signal(&cv); pthread_mutex_unlock(&mu); }
static void *worker_cv(void *x) {
    (void)x; unsigned seen = 0;
    for (;;) {
        pthread_mutex_lock(&mu);
        while (queued == seen && !stop) pthread_cond_wait(&cv, &mu);
        unsigned q = queued; pthread_mutex_unlock(&mu);
        if (stop) return 0;
        for (unsigned i = seen + 1; i <= q; i++) { spin_us(io_us); __atomic_store_n(&words[0], i, __ATOMIC_RELEASE); }
        seen = q;
    }
}
static void *worker_poll(void *x) {
    (void)x; unsigned seen = 0;
    while (!stop) {
        unsigned r = __atomic_load_n(&words[reach_idx], __ATOMIC_ACQUIRE);
        for (unsigned i = seen + 1; (int)(r - i) >= 0; i++) { spin_us(io_us); __atomic_store_n(&words[0], i, __ATOMIC_RELEASE); seen = i; }
    }
    return 0;
}

static const char *ptx =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry k(.param .u64 p){ .reg .b64 %rd<3>; .reg .b32 %r<2>; ld.param.u64 %rd1,[p]; cvta.to.global.u64 %rd2,%rd1; mov.u32 %r1,1; st.global.u32 [%rd2],%r1; membar.sys; ret; }\n";

// As ugds's staging copy kernel: thread 0 of each block reads its header
// (dst, src, len) from the address given, volatile, then copies len bytes.
static const char *ptx_hdr =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry kh(.param .u64 p){ .reg .pred %p<3>; .reg .b32 %r<4>; .reg .b64 %rd<12>; .shared .align 8 .b64 hdr[3];"
    " mov.u32 %r1,%tid.x; setp.ne.u32 %p1,%r1,0; @%p1 bra L; ld.param.u64 %rd1,[p];"
    " ld.volatile.global.u64 %rd2,[%rd1]; ld.volatile.global.u64 %rd3,[%rd1+8]; ld.volatile.global.u64 %rd4,[%rd1+16];"
    " st.shared.u64 [hdr],%rd2; st.shared.u64 [hdr+8],%rd3; st.shared.u64 [hdr+16],%rd4;"
    " L: bar.sync 0; ld.shared.u64 %rd4,[hdr+16]; cvt.u64.u32 %rd5,%r1;"
    " LOOP: setp.ge.u64 %p2,%rd5,%rd4; @%p2 bra D; ld.shared.u64 %rd2,[hdr]; ld.shared.u64 %rd3,[hdr+8];"
    " add.u64 %rd6,%rd3,%rd5; add.u64 %rd7,%rd2,%rd5; ld.global.u8 %r2,[%rd6]; st.global.u8 [%rd7],%r2; add.u64 %rd5,%rd5,256; bra LOOP;"
    " D: membar.sys; ret; }\n";

static void reset(CUstream s) { CK(cuStreamSynchronize(s)); memset((void *)words, 0, 256); }

int main(int argc, char **argv) {
    setvbuf(stdout, 0, _IONBF, 0);
    int n = argc > 1 ? atoi(argv[1]) : 2000;
    io_us = argc > 2 ? atof(argv[2]) : 35;
    CUdevice dev; CUcontext pc;
    double t = now_us(); CK(cuInit(0)); CK(cuDeviceGet(&dev, 0)); CK(cuDevicePrimaryCtxRetain(&pc, dev)); CK(cuCtxSetCurrent(pc));
    printf("setup: cuInit + primary context %.1f ms\n", (now_us() - t) / 1e3);
    CUdeviceptr buf; CK(cuMemAlloc(&buf, 64 << 20));
    // Set-up calls.
    t = now_us(); CUcontext own; CK(ctx_create_v2(&own, 0, dev)); double tc = now_us() - t;
    t = now_us(); CUstream cs[8]; for (int i = 0; i < 8; i++) CK(cuStreamCreate(&cs[i], CU_STREAM_NON_BLOCKING)); double ts = now_us() - t;
    void *pin = aligned_alloc(1 << 21, 1 << 21); memset(pin, 1, 1 << 21);
    t = now_us(); CK(cuMemcpyHtoDAsync(buf, pin, 4096, cs[0])); CK(cuStreamSynchronize(cs[0])); double tf = now_us() - t;
    CUcontext popped; CK(cuCtxPopCurrent(&popped)); CK(cuCtxSetCurrent(pc));
    printf("setup: cuCtxCreate %.1f ms, 8 x cuStreamCreate %.3f ms, first pageable 4 KiB copy in it %.3f ms\n", tc / 1e3, ts / 1e3, tf / 1e3);
    t = now_us(); CK(cuMemHostRegister(pin, 1 << 21, CU_MEMHOSTREGISTER_PORTABLE)); printf("setup: cuMemHostRegister 2 MiB %.3f ms\n", (now_us() - t) / 1e3);
    CUstream ps; t = now_us(); CK(cuStreamCreate(&ps, CU_STREAM_NON_BLOCKING)); printf("setup: cuStreamCreate in the primary context %.3f ms\n", (now_us() - t) / 1e3);
    t = now_us(); CK(cuMemcpyHtoDAsync(buf, pin, 4096, ps)); CK(cuStreamSynchronize(ps)); printf("setup: first pinned 4 KiB copy, primary context %.3f ms\n", (now_us() - t) / 1e3);
    t = now_us(); for (int i = 0; i < 1000; i++) { CK(cuMemcpyHtoDAsync(buf, pin, 4096, ps)); CK(cuStreamSynchronize(ps)); } printf("steady: pinned 4 KiB copy + sync %.2f us\n", (now_us() - t) / 1e3);
    CUevent ev; CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
    t = now_us(); for (int i = 0; i < 1000; i++) { CK(cuMemcpyHtoDAsync(buf, pin, 4096, ps)); CK(cuEventRecord(ev, ps)); while (cuEventQuery(ev) == CUDA_ERROR_NOT_READY) {} } printf("steady: pinned 4 KiB copy + event poll %.2f us\n", (now_us() - t) / 1e3);
    t = now_us(); void *mh; CK(cuMemHostAlloc(&mh, 1 << 21, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE)); printf("setup: cuMemHostAlloc 2 MiB mapped %.3f ms\n", (now_us() - t) / 1e3);
    CUmodule mod; CUfunction k; t = now_us(); CK(cuModuleLoadData(&mod, ptx)); CK(cuModuleGetFunction(&k, mod, "k")); printf("setup: cuModuleLoadData (PTX, one kernel) %.3f ms\n", (now_us() - t) / 1e3);

    CK(cuMemHostAlloc((void **)&words, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
    CK(cuMemHostGetDevicePointer(&dwords, (void *)words, 0));
    CUstream s; CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    pthread_t w1, w2;
    void *kp[] = {&buf};
    CUmodule modh; CUfunction kh; CK(cuModuleLoadData(&modh, ptx_hdr)); CK(cuModuleGetFunction(&kh, modh, "kh"));
    // A header in host-mapped memory (the page after the words), copying
    // nothing (len 0), and one in device memory.
    unsigned long long *hh = (unsigned long long *)((char *)words + 2048); hh[0] = hh[1] = hh[2] = 0;
    CUdeviceptr hdr_host = dwords + 2048, hdr_dev; CK(cuMemAlloc(&hdr_dev, 64)); CK(cuMemsetD8(hdr_dev, 0, 64));
    void *kph[] = {&hdr_host}, *kpd[] = {&hdr_dev};
    // A second device header that copies 4 KiB from host-mapped memory, and
    // a host header copied to the device on the stream before the kernel.
    CUdeviceptr mhd; CK(cuMemHostGetDevicePointer(&mhd, mh, 0));
    unsigned long long h4[3] = {buf, mhd, 4096};
    CUdeviceptr hdr_dev4; CK(cuMemAlloc(&hdr_dev4, 64)); CK(cuMemcpyHtoD(hdr_dev4, h4, 24));
    void *kpd4[] = {&hdr_dev4};
    const char *names[] = {"hostfn", "hostfn+io", "reach+io", "reach+io+k", "+one line", "+64x256 k", "+host hdr k",
                           "+dev hdr k", "+dev hdr 4k", "+hdr copy k"};
    for (int path = 0; path < 10; path++) {
        reach_idx = path == 4 ? 2 : 16;
        unsigned reach_off = path == 4 ? 8 : 64, passed_off = path == 4 ? 4 : 128;
        for (int rep = 0; rep < 2; rep++) {
            reset(s); stop = 0; queued = 0;
            pthread_create(&w1, 0, worker_cv, 0); pthread_create(&w2, 0, worker_poll, 0);
            double io0 = io_us; if (path == 0) io_us = 0;
            t = now_us();
            for (int i = 1; i <= n; i++) {
                if (path == 0) CK(cuLaunchHostFunc(s, hf_direct, (void *)(size_t)i));
                else if (path == 1) CK(cuLaunchHostFunc(s, hf_handoff, (void *)(size_t)i));
                else CK(cuStreamWriteValue32(s, dwords + reach_off, i, 0));
                CK(cuStreamWaitValue32(s, dwords, i, CU_STREAM_WAIT_VALUE_GEQ));
                if (path == 3 || path == 4) CK(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, s, kp, 0));
                if (path == 5) CK(cuLaunchKernel(k, 64, 1, 1, 256, 1, 1, 0, s, kp, 0));
                if (path == 6) CK(cuLaunchKernel(kh, 64, 1, 1, 256, 1, 1, 0, s, kph, 0));
                if (path == 7) CK(cuLaunchKernel(kh, 64, 1, 1, 256, 1, 1, 0, s, kpd, 0));
                if (path == 8) CK(cuLaunchKernel(kh, 64, 1, 1, 256, 1, 1, 0, s, kpd4, 0));
                if (path == 9) {
                    CK(cuMemcpyHtoDAsync(hdr_dev, (void *)hh, 24, s));
                    CK(cuLaunchKernel(kh, 64, 1, 1, 256, 1, 1, 0, s, kpd, 0));
                }
                CK(cuStreamWriteValue32(s, dwords + passed_off, i, 0));
            }
            CK(cuStreamSynchronize(s));
            double per = (now_us() - t) / n; io_us = io0;
            if (rep) printf("path %-11s io %4.0f us: %.1f us per operation (%d in a row)\n", names[path], path ? io_us : 0.0, per, n);
            stop = 1; pthread_mutex_lock(&mu); pthread_cond_broadcast(&cv); pthread_mutex_unlock(&mu);
            pthread_join(w1, 0); pthread_join(w2, 0);
        }
        reset(s);
    }
    // GPU poll latency on a host word after a wait of each length: one
    // operation at a time, the host sets done after W us and times the
    // stream's `passed` write.
    double waits[] = {0, 10, 35, 100, 300, 1000, 3000};
    for (int wi = 0; wi < 7; wi++) {
        reset(s);
        double sum = 0, mx = 0; int m = waits[wi] >= 1000 ? 100 : 500;
        for (int i = 1; i <= m; i++) {
            CK(cuStreamWriteValue32(s, dwords + 64, i, 0));
            CK(cuStreamWaitValue32(s, dwords, i, CU_STREAM_WAIT_VALUE_GEQ));
            CK(cuStreamWriteValue32(s, dwords + 128, i, 0));
            while (__atomic_load_n(&words[16], __ATOMIC_ACQUIRE) != (unsigned)i) {}
            spin_us(waits[wi]);
            double s0 = now_us();
            __atomic_store_n(&words[0], i, __ATOMIC_RELEASE);
            while (__atomic_load_n(&words[32], __ATOMIC_ACQUIRE) != (unsigned)i) {}
            double d = now_us() - s0; sum += d; if (d > mx) mx = d;
        }
        printf("GPU sees a host word after a wait of %5.0f us: mean %.1f us, max %.1f us (%d)\n", waits[wi], sum / m, mx, m);
    }
    // The same with the word in device memory, copied there by the host on a
    // stream of another context (the copy engine's).
    CUdeviceptr dw; CK(cuMemAlloc(&dw, 4096)); CK(cuMemsetD32(dw, 0, 1024));
    unsigned *src; CK(cuMemHostAlloc((void **)&src, 4096, CU_MEMHOSTALLOC_PORTABLE));
    for (int wi = 0; wi < 7; wi++) {
        reset(s); CK(cuMemsetD32(dw, 0, 1024)); CK(cuCtxSynchronize());
        double sum = 0, mx = 0, enq = 0; int m = waits[wi] >= 1000 ? 100 : 500;
        for (int i = 1; i <= m; i++) {
            CK(cuStreamWriteValue32(s, dwords + 64, i, 0));
            CK(cuStreamWaitValue32(s, dw, i, CU_STREAM_WAIT_VALUE_GEQ));
            CK(cuStreamWriteValue32(s, dwords + 128, i, 0));
            while (__atomic_load_n(&words[16], __ATOMIC_ACQUIRE) != (unsigned)i) {}
            spin_us(waits[wi]);
            double s0 = now_us();
            src[i % 1024] = i;
            CK(cuCtxPushCurrent(own)); CK(cuMemcpyHtoDAsync(dw, &src[i % 1024], 4, cs[1])); CK(cuCtxPopCurrent(&popped));
            enq += now_us() - s0;
            while (__atomic_load_n(&words[32], __ATOMIC_ACQUIRE) != (unsigned)i) {}
            double d = now_us() - s0; sum += d; if (d > mx) mx = d;
        }
        printf("GPU sees a device word written from another context after %5.0f us: mean %.1f us (enqueue %.1f), max %.1f us\n", waits[wi], sum / m, enq / m, mx);
    }
    return 0;
}
