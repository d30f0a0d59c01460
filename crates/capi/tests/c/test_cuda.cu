// The C interface with CUDA device memory (run on a GPU machine by
// scripts/ctest when nvcc is present): registration and its checks, sync
// I/O (registered and just-in-time), stream-ordered I/O on a CUDA stream
// with late-bound values and a kernel after it (on a handle and on a
// volume), dma-buf export.
#include <cuda_runtime.h>
#include <sys/stat.h>

extern "C" {
#include "common.h"
}

#define MIB (1u << 20)

__global__ void sum_bytes(const unsigned char *p, size_t n, unsigned long long *out) {
    unsigned long long s = 0;
    for (size_t i = threadIdx.x; i < n; i += blockDim.x) s += p[i];
    atomicAdd(out, s);
}

int main(void) {
    setenv("UGDS_EMULATE", "1", 1);
    char path[256];
    int fd = temp_file(path, sizeof path, 64 * MIB);
    unsigned char *host = (unsigned char *)malloc(16 * MIB);
    fill(host, 16 * MIB, 9, 0);
    CHECK(pwrite(fd, host, 16 * MIB, 0) == (ssize_t)(16 * MIB));

    CHECK(cudaSetDevice(0) == cudaSuccess);
    unsigned char *gpu = NULL;
    CHECK(cudaMalloc(&gpu, 16 * MIB) == cudaSuccess);

    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);

    // Just-in-time: an unregistered GPU buffer, 64 KiB aligned, then not.
    CHECK_RET(uGDSRead(fh, gpu, MIB, 0, 0), MIB);
    CHECK_RET(uGDSRead(fh, gpu, 4096, 0, 4096), -EINVAL);
    unsigned char *back = (unsigned char *)malloc(16 * MIB);
    CHECK(cudaMemcpy(back, gpu, MIB, cudaMemcpyDeviceToHost) == cudaSuccess && same(back, MIB, 9, 0));

    // Registration checks.
    CHECK_ERR(uGDSBufRegister(gpu + 4096, 16 * MIB, 0), UGDS_CUDA_POINTER_RANGE_ERROR);
    uGDSBufConfig_t cfg = {UGDS_BACKEND_CUDA, true};
    CHECK_ERR(uGDSBufRegisterEx(gpu, 16 * MIB, &cfg), UGDS_SUCCESS);

    // Sync, registered.
    CHECK(cudaMemset(gpu, 0, 16 * MIB) == cudaSuccess);
    // Synchronous I/O is not ordered with GPU work (as with cuFile): the
    // memset may still be running unless waited for.
    CHECK(cudaDeviceSynchronize() == cudaSuccess);
    CHECK_RET(uGDSRead(fh, gpu, 4 * MIB, 4 * MIB, MIB), 4 * MIB);
    CHECK(cudaMemcpy(back, gpu + MIB, 4 * MIB, cudaMemcpyDeviceToHost) == cudaSuccess &&
          same(back, 4 * MIB, 9, 4 * MIB));
    CHECK_RET(uGDSWrite(fh, gpu + MIB, 4 * MIB, 32 * MIB, 0), 4 * MIB);
    CHECK(pread(fd, back, 4 * MIB, 32 * MIB) == (ssize_t)(4 * MIB) && same(back, 4 * MIB, 9, 4 * MIB));

    // Stream-ordered, with the values set after the call and before the
    // stream gets there (a host function holds the stream meanwhile).
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    // Allocated before the stream is held: allocation may synchronize.
    unsigned long long *sum, sum_host = 0;
    CHECK(cudaMalloc(&sum, sizeof *sum) == cudaSuccess);
    CHECK(cudaMemset(sum, 0, sizeof *sum) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess);
    // Loads the kernel now (lazy loading may synchronize at first launch).
    sum_bytes<<<1, 1, 0, s>>>(gpu, 0, sum);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK_ERR(uGDSStreamRegister(s), UGDS_SUCCESS);
    volatile int gate = 0;
    CHECK(cudaLaunchHostFunc(s, [](void *g) { while (!*(volatile int *)g) {} }, (void *)&gate) == cudaSuccess);
    size_t size = 0;
    off_t foff = 3, boff = 0;
    ssize_t done = 12345;
    CHECK(cudaMemsetAsync(gpu, 0, 16 * MIB, s) == cudaSuccess);
    CHECK_ERR(uGDSReadAsync(fh, gpu, &size, &foff, &boff, &done, s), UGDS_SUCCESS);
    sum_bytes<<<1, 256, 0, s>>>(gpu + MIB, 2 * MIB, sum);
    size = 2 * MIB;
    foff = 6 * MIB;
    boff = MIB;
    gate = 1;
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(done == (ssize_t)(2 * MIB));
    unsigned long long want = 0;
    for (size_t i = 0; i < 2 * MIB; i++) want += pat(9, 6 * MIB + i);
    CHECK(cudaMemcpy(&sum_host, sum, sizeof sum_host, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(sum_host == want); // the kernel after the read saw its data
    CHECK(cudaMemcpy(back, gpu + MIB, 2 * MIB, cudaMemcpyDeviceToHost) == cudaSuccess &&
          same(back, 2 * MIB, 9, 6 * MIB));
    // A bad late value fails that operation with a negative errno.
    size = 4096;
    foff = 7;
    CHECK_ERR(uGDSReadAsync(fh, gpu, &size, &foff, &boff, &done, s), UGDS_SUCCESS);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(done == -EINVAL);
    // Writes, many on one stream.
    size_t wsz[8];
    off_t wfo[8], wbo[8];
    ssize_t wd[8];
    for (int i = 0; i < 8; i++) {
        wsz[i] = MIB;
        wfo[i] = (off_t)(40 + i) * MIB;
        wbo[i] = (off_t)i * MIB;
        CHECK_ERR(uGDSWriteAsync(fh, gpu, &wsz[i], &wfo[i], &wbo[i], &wd[i], s), UGDS_SUCCESS);
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    for (int i = 0; i < 8; i++) CHECK(wd[i] == (ssize_t)MIB);

    // Stream-ordered I/O on a volume of two more controllers (64 KiB
    // stripes): a write from GPU memory lands on both member files, a read
    // brings it back into GPU memory; the values are read when the stream
    // gets there.
    char p1[256], p2[256];
    int f1 = temp_file(p1, sizeof p1, 16 * MIB), f2 = temp_file(p2, sizeof p2, 16 * MIB);
    uGDSHandle_t members[2] = {open_handle(f1), open_handle(f2)};
    uGDSHandle_t vh = NULL;
    CHECK_ERR(uGDSVolumeOpen(&vh, members, 2, 64 * 1024), UGDS_SUCCESS);
    size_t vsz = 0;
    off_t vfo = 0, vbo = 0;
    ssize_t vdone = 0;
    gate = 0;
    CHECK(cudaLaunchHostFunc(s, [](void *g) { while (!*(volatile int *)g) {} }, (void *)&gate) == cudaSuccess);
    CHECK_ERR(uGDSWriteAsync(vh, gpu, &vsz, &vfo, &vbo, &vdone, s), UGDS_SUCCESS);
    vsz = 2 * MIB;
    vbo = MIB; // gpu + 1 MiB holds pattern 9 from 6 MiB (the read above)
    gate = 1;
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(vdone == (ssize_t)(2 * MIB));
    // Volume bytes [64K, 128K) are member 1's first stripe.
    CHECK(pread(f2, back, 64 * 1024, 0) == 64 * 1024 && same(back, 64 * 1024, 9, 6 * MIB + 64 * 1024));
    CHECK(pread(f1, back, 64 * 1024, 0) == 64 * 1024 && same(back, 64 * 1024, 9, 6 * MIB));
    size_t rsz = 2 * MIB;
    off_t rfo = 0, rbo = 8 * MIB;
    ssize_t rdone = 0;
    CHECK_ERR(uGDSReadAsync(vh, gpu, &rsz, &rfo, &rbo, &rdone, s), UGDS_SUCCESS);
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(rdone == (ssize_t)(2 * MIB));
    CHECK(cudaMemcpy(back, gpu + 8 * MIB, 2 * MIB, cudaMemcpyDeviceToHost) == cudaSuccess &&
          same(back, 2 * MIB, 9, 6 * MIB));
    uGDSHandleDeregister(vh);
    uGDSHandleDeregister(members[0]);
    uGDSHandleDeregister(members[1]);
    close(f1);
    close(f2);
    unlink(p1);
    unlink(p2);

    // dma-buf export of the registered GPU memory.
    uGDSDmabufExport_t x;
    CHECK_ERR(uGDSExportDmabuf(gpu, &x), UGDS_SUCCESS);
    CHECK(x.fd >= 0 && x.offset == 0 && x.length == 16 * MIB);
    CHECK(lseek(x.fd, 0, SEEK_END) == (off_t)(16 * MIB));
    close(x.fd);

    CHECK_ERR(uGDSStreamDeregister(s), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufDeregister(gpu), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    cudaStreamDestroy(s);
    cudaFree(gpu);
    cudaFree(sum);
    close(fd);
    unlink(path);
    free(host);
    free(back);
    return finish("test_cuda");
}
