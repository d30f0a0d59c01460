// libcufile on CUDA device memory: synchronous reads and writes at any
// offset (registered or not), stream-ordered reads and writes with values
// bound late and fixed at enqueue, and an unregistered buffer freed and
// allocated again between two stream-ordered reads. Built with nvcc against
// cufile.h by scripts/cufile-judges (a GPU machine).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cufile.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHECK(what, cond)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, what);       \
            exit(1);                                                        \
        }                                                                   \
    } while (0)

static unsigned char *host_pattern(size_t n, unsigned seed) {
    unsigned char *p = (unsigned char *)malloc(n);
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31 + seed + (i >> 12));
    return p;
}

static bool device_equals(const void *dev, const unsigned char *want, size_t n) {
    unsigned char *h = (unsigned char *)malloc(n);
    CHECK("cudaMemcpy", cudaMemcpy(h, dev, n, cudaMemcpyDeviceToHost) == cudaSuccess);
    bool same = !memcmp(h, want, n);
    free(h);
    return same;
}

struct Late {
    size_t *size;
    off_t *foff, *boff;
};

static void CUDART_CB set_late(void *p) {
    Late *l = (Late *)p;
    *l->size = 1 << 20;
    *l->foff = 4 << 20;
    *l->boff = 4096;
}

int main(void) {
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[256];
    snprintf(path, sizeof path, "%s/ugds-cufile-cuda-%d.img", dir, (int)getpid());
    const size_t len = 32 << 20;
    unsigned char *file = host_pattern(len, 3);
    int w = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    CHECK("write the file", w >= 0 && write(w, file, len) == (ssize_t)len);
    close(w);
    CHECK("cudaSetDevice", cudaSetDevice(0) == cudaSuccess);
    CHECK("DriverOpen", cuFileDriverOpen().err == CU_FILE_SUCCESS);
    int fd = open(path, O_RDWR | O_DIRECT);
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    CUfileHandle_t fh;
    CHECK("HandleRegister", cuFileHandleRegister(&fh, &d).err == CU_FILE_SUCCESS);

    // Synchronous, unregistered, unaligned in the file and in memory.
    void *g = NULL;
    CHECK("cudaMalloc", cudaMalloc(&g, 16 << 20) == cudaSuccess);
    CHECK("read unaligned", cuFileRead(fh, g, 100000, 12345, 7) == 100000);
    CHECK("its data", device_equals((char *)g + 7, file + 12345, 100000));
    CHECK("BufRegister", cuFileBufRegister(g, 16 << 20, 0).err == CU_FILE_SUCCESS);
    CHECK("read registered 16 MiB", cuFileRead(fh, g, 16 << 20, 8 << 20, 0) == 16 << 20);
    CHECK("its data", device_equals(g, file + (8 << 20), 16 << 20));
    unsigned char *mine = host_pattern(777, 9);
    CHECK("cudaMemcpy", cudaMemcpy((char *)g + 4096, mine, 777, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK("write unaligned from device memory", cuFileWrite(fh, g, 777, 4097, 4096) == 777);
    memcpy(file + 4097, mine, 777);

    // Stream-ordered: values bound late (an unregistered stream), then
    // fixed at enqueue (flags 15: a 16 MiB read copied in pieces).
    cudaStream_t s;
    CHECK("cudaStreamCreate", cudaStreamCreate(&s) == cudaSuccess);
    size_t size = 0;
    off_t foff = 1, boff = 1 << 30;
    ssize_t done = 0;
    // Invalid when enqueued; a host function the stream runs first sets them.
    Late late = {&size, &foff, &boff};
    CHECK("cudaLaunchHostFunc", cudaLaunchHostFunc(s, set_late, &late) == cudaSuccess);
    CHECK("ReadAsync", cuFileReadAsync(fh, g, &size, &foff, &boff, &done, s).err == CU_FILE_SUCCESS);
    CHECK("sync", cudaStreamSynchronize(s) == cudaSuccess);
    CHECK("late values read", done == 1 << 20);
    CHECK("its data", device_equals((char *)g + 4096, file + (4 << 20), 1 << 20));
    cudaStream_t f;
    CHECK("cudaStreamCreate", cudaStreamCreate(&f) == cudaSuccess);
    CHECK("StreamRegister(15)", cuFileStreamRegister(f, 15).err == CU_FILE_SUCCESS);
    size_t fsize = 16 << 20;
    off_t ffoff = 16 << 20, fboff = 0;
    ssize_t fdone = 0;
    CHECK("ReadAsync fixed", cuFileReadAsync(fh, g, &fsize, &ffoff, &fboff, &fdone, f).err == CU_FILE_SUCCESS);
    CHECK("sync", cudaStreamSynchronize(f) == cudaSuccess);
    CHECK("16 MiB in pieces", fdone == 16 << 20 && device_equals(g, file + (16 << 20), 16 << 20));
    size_t wsize = 1 << 20;
    off_t wfoff = len, wboff = 0;  // past the end: the file grows
    ssize_t wdone = 0;
    CHECK("WriteAsync past the end", cuFileWriteAsync(fh, g, &wsize, &wfoff, &wboff, &wdone, f).err == CU_FILE_SUCCESS);
    CHECK("sync", cudaStreamSynchronize(f) == cudaSuccess);
    CHECK("written", wdone == 1 << 20);
    CHECK("StreamDeregister", cuFileStreamDeregister(f).err == CU_FILE_SUCCESS);
    CHECK("BufDeregister", cuFileBufDeregister(g).err == CU_FILE_SUCCESS);
    CHECK("cudaFree", cudaFree(g) == cudaSuccess);

    // An unregistered allocation, freed and allocated again smaller: the
    // registration made for the first is not used for the second.
    void *a = NULL, *b = NULL;
    CHECK("cudaMalloc 8 MiB", cudaMalloc(&a, 8 << 20) == cudaSuccess);
    size = 8 << 20, foff = 0, boff = 0;
    CHECK("ReadAsync unregistered", cuFileReadAsync(fh, a, &size, &foff, &boff, &done, s).err == CU_FILE_SUCCESS);
    CHECK("sync", cudaStreamSynchronize(s) == cudaSuccess);
    CHECK("8 MiB", done == 8 << 20 && device_equals(a, file, 8 << 20));
    CHECK("cudaFree", cudaFree(a) == cudaSuccess);
    CHECK("cudaMalloc 2 MiB", cudaMalloc(&b, 2 << 20) == cudaSuccess);
    printf("second allocation %s the first's address\n", a == b ? "at" : "not at");
    size = 2 << 20, foff = 2 << 20, boff = 0;
    CHECK("ReadAsync again", cuFileReadAsync(fh, b, &size, &foff, &boff, &done, s).err == CU_FILE_SUCCESS);
    CHECK("sync", cudaStreamSynchronize(s) == cudaSuccess);
    CHECK("2 MiB", done == 2 << 20 && device_equals(b, file + (2 << 20), 2 << 20));
    // Beyond the new allocation: refused when bound, never written.
    size = 4 << 20, foff = 0, boff = 0;
    CHECK("ReadAsync past the allocation", cuFileReadAsync(fh, b, &size, &foff, &boff, &done, s).err == CU_FILE_SUCCESS);
    CHECK("sync", cudaStreamSynchronize(s) == cudaSuccess);
    CHECK("refused", done < 0);
    CHECK("cudaFree", cudaFree(b) == cudaSuccess);
    cuFileHandleDeregister(fh);
    CHECK("DriverClose", cuFileDriverClose().err == CU_FILE_SUCCESS);
    close(fd);
    unlink(path);
    printf("test_cufile_cuda: ok\n");
    return 0;
}
