// The C interface with CUDA under the patterns real callers use (run on a
// GPU machine by scripts/ctest when nvcc is present): dma-buf export only
// of memory registered for it; streams the caller destroys before tearing
// the rest down, in each order; 64 streams carrying reads and writes at
// once, each with kernels before and after.
#include <cuda_runtime.h>
#include <dirent.h>

extern "C" {
#include "common.h"
}

#define KIB 1024u
#define NSTREAMS 64
#define SZ (64 * KIB)

__global__ void add_one(unsigned char *p, size_t n) {
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) p[i] += 1;
}

static int open_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    while (d && readdir(d)) n++;
    if (d) closedir(d);
    return n;
}

static void export_only_when_asked(int fd) {
    unsigned char *gpu = NULL;
    CHECK(cudaMalloc(&gpu, 4u << 20) == cudaSuccess);
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);
    uGDSDmabufExport_t x;
    CHECK_ERR(uGDSExportDmabuf(gpu, &x), UGDS_MEMORY_NOT_REGISTERED);
    CHECK_ERR(uGDSBufRegister(gpu, 4u << 20, 0), UGDS_SUCCESS);
    CHECK_ERR(uGDSExportDmabuf(gpu, &x), UGDS_IO_NOT_SUPPORTED);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    uGDSBufConfig_t no = {UGDS_BACKEND_CUDA, false}, yes = {UGDS_BACKEND_CUDA, true};
    CHECK_ERR(uGDSBufRegisterEx(gpu, 4u << 20, &no), UGDS_SUCCESS);
    CHECK_ERR(uGDSExportDmabuf(gpu, &x), UGDS_IO_NOT_SUPPORTED);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufRegisterEx(gpu, 4u << 20, &yes), UGDS_SUCCESS);
    int before = open_fds();
    for (int i = 0; i < 200; i++) {
        x.fd = -1;
        CHECK_ERR(uGDSExportDmabuf(gpu, &x), UGDS_SUCCESS);
        CHECK(x.fd >= 0 && x.length == 4u << 20);
        close(x.fd);
    }
    CHECK(open_fds() == before); // nothing leaks over repeated cycles
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    // A plain registration after an exportable one is not exportable.
    CHECK_ERR(uGDSBufRegister(gpu, 4u << 20, 0), UGDS_SUCCESS);
    CHECK_ERR(uGDSExportDmabuf(gpu, &x), UGDS_IO_NOT_SUPPORTED);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    cudaFree(gpu);
}

/* order 0: destroy the stream, no uGDSStreamDeregister; 1: destroy, then
 * uGDSStreamDeregister; 2: destroy with a kernel and the reads still queued,
 * never registered; then buffers, handle, driver. */
static void stream_destroyed_first(int fd, int order) {
    unsigned char *gpu = NULL;
    CHECK(cudaMalloc(&gpu, 1u << 20) == cudaSuccess);
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);
    CHECK_ERR(uGDSBufRegister(gpu, 1u << 20, 0), UGDS_SUCCESS);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    if (order != 2) CHECK_ERR(uGDSStreamRegister(s), UGDS_SUCCESS);
    size_t size[4];
    off_t foff[4], boff[4];
    ssize_t done[4];
    if (order == 2) add_one<<<64, 256, 0, s>>>(gpu, 1u << 20);
    for (int i = 0; i < 4; i++) {
        size[i] = SZ;
        foff[i] = (off_t)i * SZ;
        boff[i] = (off_t)i * SZ;
        done[i] = 0;
        CHECK_ERR(uGDSReadAsync(fh, gpu, &size[i], &foff[i], &boff[i], &done[i], s), UGDS_SUCCESS);
    }
    if (order != 2) CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    if (order == 1) CHECK_ERR(uGDSStreamDeregister(s), UGDS_SUCCESS);
    if (order == 2) CHECK(cudaDeviceSynchronize() == cudaSuccess); // CUDA runs a destroyed stream's work
    for (int i = 0; i < 4; i++) CHECK(done[i] == (ssize_t)SZ);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    // A stream created now may get the destroyed one's address: it works.
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    fh = open_handle(fd);
    CHECK_ERR(uGDSBufRegister(gpu, 1u << 20, 0), UGDS_SUCCESS);
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK_ERR(uGDSReadAsync(fh, gpu, &size[0], &foff[0], &boff[0], &done[0], s), UGDS_SUCCESS);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(done[0] == (ssize_t)SZ);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    cudaFree(gpu);
}

static void many_streams(int fd) {
    unsigned char *gpu = NULL;
    CHECK(cudaMalloc(&gpu, NSTREAMS * SZ) == cudaSuccess);
    CHECK(cudaMemset(gpu, 0, NSTREAMS * SZ) == cudaSuccess);
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);
    CHECK_ERR(uGDSBufRegister(gpu, NSTREAMS * SZ, 0), UGDS_SUCCESS);
    cudaStream_t s[NSTREAMS];
    size_t size[NSTREAMS][2];
    off_t foff[NSTREAMS][2], boff[NSTREAMS][2];
    ssize_t done[NSTREAMS][2];
    for (int i = 0; i < NSTREAMS; i++) CHECK(cudaStreamCreateWithFlags(&s[i], cudaStreamNonBlocking) == cudaSuccess);
    for (int i = 0; i < NSTREAMS; i++) {
        unsigned char *mine = gpu + (size_t)i * SZ;
        add_one<<<4, 256, 0, s[i]>>>(mine, SZ); // before: overwritten by the read
        size[i][0] = SZ;
        foff[i][0] = (off_t)i * SZ;
        boff[i][0] = (off_t)i * SZ;
        CHECK_ERR(uGDSReadAsync(fh, gpu, &size[i][0], &foff[i][0], &boff[i][0], &done[i][0], s[i]), UGDS_SUCCESS);
        add_one<<<4, 256, 0, s[i]>>>(mine, SZ); // after the read: sees its data
        size[i][1] = SZ;
        foff[i][1] = (off_t)(32u << 20) + (off_t)i * SZ;
        boff[i][1] = (off_t)i * SZ;
        CHECK_ERR(uGDSWriteAsync(fh, gpu, &size[i][1], &foff[i][1], &boff[i][1], &done[i][1], s[i]), UGDS_SUCCESS);
        add_one<<<4, 256, 0, s[i]>>>(mine, SZ); // after the write
    }
    for (int i = 0; i < NSTREAMS; i++) CHECK(cudaStreamSynchronize(s[i]) == cudaSuccess);
    unsigned char *back = (unsigned char *)malloc(NSTREAMS * SZ);
    int bad = 0;
    for (int i = 0; i < NSTREAMS; i++) bad += done[i][0] != (ssize_t)SZ || done[i][1] != (ssize_t)SZ;
    CHECK(bad == 0);
    // The file: what each stream read, plus one.
    CHECK(pread(fd, back, NSTREAMS * SZ, 32u << 20) == (ssize_t)(NSTREAMS * SZ));
    for (size_t i = 0; i < NSTREAMS * SZ && !bad; i++) bad += back[i] != (unsigned char)(pat(9, i) + 1);
    CHECK(bad == 0);
    // GPU memory: plus two.
    CHECK(cudaMemcpy(back, gpu, NSTREAMS * SZ, cudaMemcpyDeviceToHost) == cudaSuccess);
    for (size_t i = 0; i < NSTREAMS * SZ && !bad; i++) bad += back[i] != (unsigned char)(pat(9, i) + 2);
    CHECK(bad == 0);
    for (int i = 0; i < NSTREAMS; i++) cudaStreamDestroy(s[i]);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    free(back);
    cudaFree(gpu);
}

// Vectored reads and writes in stream order on a CUDA stream: host
// segments gathered to the file and scattered back in reverse, the file
// offset read when the stream gets there; then GPU segments (staged through
// the stream on the emulated controller), with a kernel after the read.
static void vectored_in_stream_order(int fd) {
    unsigned char *host = NULL, *gpu = NULL;
    host = (unsigned char *)aligned_alloc(4096, 256 * KIB);
    CHECK(host != NULL);
    CHECK(cudaMalloc(&gpu, 64 * KIB) == cudaSuccess);
    fill(host, 128 * KIB, 21, 0);
    memset(host + 128 * KIB, 0, 128 * KIB);
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);
    CHECK_ERR(uGDSBufRegister(host, 256 * KIB, 0), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufRegister(gpu, 64 * KIB, 0), UGDS_SUCCESS);
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    // Four 32 KiB pieces of the first 128 KiB, in reverse, to 40 MiB.
    ugds_segment_t w[4], r[2];
    for (int i = 0; i < 4; i++) w[i] = (ugds_segment_t){host, (off_t)(3 - i) * 32 * KIB, 32 * KIB};
    off_t woff = 40u << 20, roff = 7; // roff: set after the call
    ssize_t wdone = 0, rdone = 0;
    CHECK_ERR(uGDSWritevAsync(fh, w, 4, &woff, &wdone, s), UGDS_SUCCESS);
    // Back into the second half in two 64 KiB pieces, swapped.
    r[0] = (ugds_segment_t){host + 192 * KIB, 0, 64 * KIB};
    r[1] = (ugds_segment_t){host, 128 * KIB, 64 * KIB};
    CHECK_ERR(uGDSReadvAsync(fh, r, 2, &roff, &rdone, s), UGDS_SUCCESS);
    roff = 40u << 20;
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(wdone == (ssize_t)(128 * KIB) && rdone == (ssize_t)(128 * KIB));
    unsigned char *want = (unsigned char *)malloc(128 * KIB);
    fill(want, 128 * KIB, 21, 0);
    int bad = 0;
    // The range: pieces 3, 2, 1, 0; its first 64 KiB (pieces 3, 2) went to
    // host + 192 KiB, the rest (1, 0) to host + 128 KiB.
    for (int i = 0; i < 4; i++) {
        unsigned char *at = host + (i < 2 ? 192 * KIB : 128 * KIB) + (size_t)(i % 2) * 32 * KIB;
        bad += memcmp(at, want + (size_t)(3 - i) * 32 * KIB, 32 * KIB) != 0;
    }
    CHECK(bad == 0);
    // Refused at the call, nothing enqueued.
    ugds_segment_t odd = {host, 0, 1000};
    CHECK_ERR(uGDSReadvAsync(fh, &odd, 1, &roff, &rdone, s), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSReadvAsync(fh, r, 0, &roff, &rdone, s), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSReadvAsync(fh, r, 2, NULL, &rdone, s), UGDS_INVALID_VALUE);
    // GPU segments: the 128 KiB range at 40 MiB scattered in two 32 KiB
    // pieces, swapped, then written back from GPU memory to 44 MiB.
    CHECK(cudaMemset(gpu, 0, 64 * KIB) == cudaSuccess);
    ugds_segment_t g[2] = {{gpu, 32 * KIB, 32 * KIB}, {gpu, 0, 32 * KIB}};
    off_t goff = 40u << 20, g2off = 44u << 20;
    ssize_t gdone = 0, g2done = 0;
    CHECK_ERR(uGDSReadvAsync(fh, g, 2, &goff, &gdone, s), UGDS_SUCCESS);
    add_one<<<4, 256, 0, s>>>(gpu, 64 * KIB); // after the read: sees its data
    CHECK_ERR(uGDSWritevAsync(fh, g, 2, &g2off, &g2done, s), UGDS_SUCCESS);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(gdone == (ssize_t)(64 * KIB) && g2done == (ssize_t)(64 * KIB));
    unsigned char *back = (unsigned char *)malloc(64 * KIB);
    CHECK(cudaMemcpy(back, gpu, 64 * KIB, cudaMemcpyDeviceToHost) == cudaSuccess);
    // The range at 40 MiB is pieces 3, 2 of the host data: piece 3 went to
    // gpu + 32 KiB, piece 2 to gpu.
    for (size_t i = 0; i < 32 * KIB; i++) {
        bad += back[32 * KIB + i] != (unsigned char)(want[3 * 32 * KIB + i] + 1);
        bad += back[i] != (unsigned char)(want[2 * 32 * KIB + i] + 1);
    }
    CHECK(bad == 0);
    CHECK(pread(fd, back, 64 * KIB, 44u << 20) == (ssize_t)(64 * KIB));
    for (size_t i = 0; i < 32 * KIB; i++) {
        bad += back[i] != (unsigned char)(want[3 * 32 * KIB + i] + 1);
        bad += back[32 * KIB + i] != (unsigned char)(want[2 * 32 * KIB + i] + 1);
    }
    CHECK(bad == 0);
    free(back);
    // The stream's totals: two host and two GPU operations; the GPU ones
    // staged as a request per segment.
    ugds_request_stats_t st;
    CHECK_ERR(uGDSStreamGetStats(s, &st), UGDS_SUCCESS);
    CHECK(st.submitted == 6 && st.ended == 6 && st.in_flight == 0 && st.errors == 0);
    CHECK(st.bytes_read == 128 * KIB + 64 * KIB && st.bytes_written == 128 * KIB + 64 * KIB);
    CHECK_ERR(uGDSStreamGetStats((void *)0x1234, &st), UGDS_INVALID_VALUE);
    // A background stream in throughput mode still moves its data.
    CHECK_ERR(uGDSStreamSetService(s, 7, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSStreamSetService(s, UGDS_PRIORITY_NORMAL, "fastest"), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSStreamSetService(s, UGDS_PRIORITY_BACKGROUND, "throughput"), UGDS_SUCCESS);
    roff = 40u << 20;
    rdone = 0;
    CHECK_ERR(uGDSReadvAsync(fh, r, 2, &roff, &rdone, s), UGDS_SUCCESS);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(rdone == (ssize_t)(128 * KIB));
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufDeregister(host), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    free(want);
    cudaFree(gpu);
    free(host);
}

int main(void) {
    setenv("UGDS_EMULATE", "1", 1);
    char path[256];
    int fd = temp_file(path, sizeof path, 64u << 20);
    unsigned char *host = (unsigned char *)malloc(16u << 20);
    fill(host, 16u << 20, 9, 0);
    CHECK(pwrite(fd, host, 16u << 20, 0) == (ssize_t)(16u << 20));
    CHECK(cudaSetDevice(0) == cudaSuccess);
    export_only_when_asked(fd);
    for (int order = 0; order < 3; order++) stream_destroyed_first(fd, order);
    many_streams(fd);
    vectored_in_stream_order(fd);
    close(fd);
    unlink(path);
    free(host);
    return finish("test_cuda_streams");
}
