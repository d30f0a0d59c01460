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
    close(fd);
    unlink(path);
    free(host);
    return finish("test_cuda_streams");
}
