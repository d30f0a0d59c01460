/* copy_to_gpu: reads a file into memory through libugds and prints a
 * checksum. With UGDS_EMULATE=1 the file is served by an emulated NVMe
 * controller, so this runs on any machine; on a machine with a controller
 * bound to ugds_drv, pass /dev/ugds_drv0 instead of a file.
 *
 *   cc copy_to_gpu.c $(pkg-config --cflags --libs ugds) -o copy_to_gpu
 *   UGDS_EMULATE=1 ./copy_to_gpu FILE [BYTES]
 *
 * (The buffer is host memory here; a cudaMalloc'd buffer is registered and
 * read the same way.) */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "ugds.h"

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE|/dev/ugds_drvN [BYTES]\n", argv[0]);
        return 2;
    }
    size_t want = argc > 2 ? strtoull(argv[2], NULL, 0) : (1u << 20);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    uGDSError_t e = uGDSDriverOpen();
    uGDSDescr_t d = {.type = UGDS_HANDLE_TYPE_OPAQUE_FD, .handle.fd = fd};
    uGDSHandle_t fh;
    if ((e = uGDSHandleRegister(&fh, &d)).err != UGDS_SUCCESS) {
        fprintf(stderr, "uGDSHandleRegister: %s (%s)\n", UGDS_ERRSTR(e.err), ugds_last_error());
        return 1;
    }
    uint64_t cap = 0;
    uGDSGetDeviceCapacity(fh, &cap);
    if (want > cap) want = cap;
    want &= ~(size_t)4095;
    void *buf = aligned_alloc(4096, want ? want : 4096);
    if ((e = uGDSBufRegister(buf, want, 0)).err != UGDS_SUCCESS) {
        fprintf(stderr, "uGDSBufRegister: %s (%s)\n", UGDS_ERRSTR(e.err), ugds_last_error());
        return 1;
    }
    ssize_t n = uGDSRead(fh, buf, want, 0, 0);
    if (n < 0) {
        fprintf(stderr, "uGDSRead: %zd (%s)\n", n, ugds_last_error());
        return 1;
    }
    uint64_t sum = 0;
    for (ssize_t i = 0; i < n; i++) sum = sum * 31 + ((unsigned char *)buf)[i];
    printf("read %zd of %llu bytes, checksum %016llx\n", n, (unsigned long long)cap, (unsigned long long)sum);
    uGDSBufDeregister(buf);
    uGDSHandleDeregister(fh);
    uGDSDriverClose();
    free(buf);
    close(fd);
    return 0;
}
