/* Every error path of the C interface that existing callers rely on, with
 * the code they expect (../shared/reference/c-api.md, "Behaviour existing
 * callers rely on"). */
#include "common.h"

int main(void) {
    char path[256];
    int fd = temp_file(path, sizeof path, 4u << 20);
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    uGDSHandle_t fh = NULL;
    unsigned char *buf = aligned_alloc(4096, 65536);

    /* Before uGDSDriverOpen. */
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_DRIVER_NOT_INITIALIZED);
    CHECK_ERR(uGDSBufRegister(buf, 65536, 0), UGDS_DRIVER_NOT_INITIALIZED);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_DRIVER_NOT_INITIALIZED);
    CHECK_ERR(uGDSStreamRegister(NULL), UGDS_DRIVER_NOT_INITIALIZED);
    CHECK_ERR(uGDSDriverClose(), UGDS_DRIVER_NOT_INITIALIZED);
    CHECK(uGDSRead(fh, buf, 4096, 0, 0) < 0);

    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    CHECK_ERR(uGDSDriverOpen(), UGDS_DRIVER_ALREADY_OPEN);

    /* Handle registration. */
    CHECK_ERR(uGDSHandleRegister(NULL, &d), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSHandleRegister(&fh, NULL), UGDS_INVALID_VALUE);
    d.type = UGDS_HANDLE_TYPE_USERSPACE_FS;
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_INVALID_FILE_TYPE);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    unsetenv("UGDS_EMULATE");
    int null_fd = open("/dev/null", O_RDWR);
    d.handle.fd = null_fd;
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_INVALID_FILE_TYPE); /* a character device not ugds_drv */
    close(null_fd);
    /* A regular file without UGDS_EMULATE: the kernel path (cuFile's
     * behaviour; the existing uGDS refuses it). */
    d.handle.fd = fd;
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_SUCCESS);
    CHECK_ERR(uGDSHandleDeregisterEx(fh, 0), UGDS_SUCCESS);
    fh = NULL;
    d.handle.fd = 0x7ffff;
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_INVALID_VALUE); /* not an open fd */
    d.handle.fd = fd;
    /* UGDS_EMULATE and UGDS_EMULATE_BLOCK_SIZE take only what ugds.h
     * names: another value refuses the handle (it used to pick the kernel
     * path, 512-byte blocks, or divide by zero, without a word). */
    setenv("UGDS_EMULATE", "yes", 1);
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_INVALID_VALUE);
    CHECK(strstr(ugds_last_error(), "UGDS_EMULATE") != NULL);
    setenv("UGDS_EMULATE", "1", 1);
    const char *bad_blocks[] = {"0", "4k", "1024"};
    for (unsigned i = 0; i < sizeof bad_blocks / sizeof bad_blocks[0]; i++) {
        setenv("UGDS_EMULATE_BLOCK_SIZE", bad_blocks[i], 1);
        CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_INVALID_VALUE);
        CHECK(strstr(ugds_last_error(), "512 or 4096") != NULL);
        CHECK(fh == NULL);
    }
    unsetenv("UGDS_EMULATE_BLOCK_SIZE");
    /* A mode by name (UGDS_MODE): an unknown one refuses the handle. */
    setenv("UGDS_MODE", "fastest", 1);
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_INVALID_VALUE);
    if (fh != NULL) {
        fprintf(stderr, "a refused handle was returned\n");
        return 1;
    }
    setenv("UGDS_MODE", "adaptive", 1);
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_SUCCESS);
    CHECK_ERR(uGDSHandleDeregisterEx(fh, 0), UGDS_SUCCESS);
    fh = NULL;
    unsetenv("UGDS_MODE");
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_SUCCESS);
    uGDSHandle_t fh2 = NULL;
    CHECK_ERR(uGDSHandleRegister(&fh2, &d), UGDS_HANDLE_ALREADY_REGISTERED);
    CHECK_ERR(uGDSGetDeviceCapacity(fh, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSGetDeviceCapacity(NULL, NULL), UGDS_INVALID_VALUE);

    /* Buffers. */
    CHECK_ERR(uGDSBufRegister(NULL, 65536, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBufRegister(buf, 0, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBufRegisterEx(buf, 65536, NULL), UGDS_INVALID_VALUE);
    uGDSBufConfig_t bad_backend = {(uGDSBackend_t)7, false};
    CHECK_ERR(uGDSBufRegisterEx(buf, 65536, &bad_backend), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBufRegister(buf, 65536, 0), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufRegister(buf, 65536, 0), UGDS_MEMORY_ALREADY_REGISTERED);
    CHECK_ERR(uGDSBufRegister(buf + 4096, 4096, 0), UGDS_MEMORY_ALREADY_REGISTERED); /* overlaps */
    CHECK_ERR(uGDSBufDeregister(NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBufDeregister(buf + 4096), UGDS_MEMORY_NOT_REGISTERED);
    uGDSDmabufExport_t x;
    CHECK_ERR(uGDSExportDmabuf(buf, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSExportDmabuf(buf, &x), UGDS_IO_NOT_SUPPORTED); /* host memory */
    uGDSRDMARegion_t region;
    CHECK_ERR(uGDSRDMARegister(buf, NULL, 0, &region), UGDS_INVALID_VALUE);

    /* Synchronous I/O: -EINVAL for what callers rely on. */
    CHECK_RET(uGDSRead(fh, buf, 4096, 100, 0), -EINVAL);  /* misaligned offset */
    CHECK_RET(uGDSRead(fh, buf, 1000, 0, 0), -EINVAL);    /* misaligned size */
    CHECK_RET(uGDSRead(fh, buf, 0, 0, 0), -EINVAL);       /* size 0 */
    CHECK_RET(uGDSRead(fh, NULL, 4096, 0, 0), -EINVAL);   /* null buffer */
    CHECK_RET(uGDSRead(fh, buf, 4096, -4096, 0), -EINVAL); /* negative offset */
    CHECK_RET(uGDSWrite(fh, buf, 4096, 0, -1), -EINVAL);
    CHECK_RET(uGDSRead(fh, buf, 4096, 8u << 20, 0), -EINVAL); /* past the namespace */
    CHECK_RET(uGDSRead(fh, buf, 131072, 0, 0), -EINVAL);   /* past the registered buffer */
    CHECK_RET(uGDSRead(fh, buf, 4096, 0, 0), 4096);        /* and the handle still works */

    /* Batch. */
    uGDSBatchHandle_t b = NULL;
    CHECK_ERR(uGDSBatchIOSetUp(NULL, fh, 4), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSetUp(&b, NULL, 4), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, 4), UGDS_SUCCESS);
    uGDSIOParams_t io[5];
    for (int i = 0; i < 5; i++) {
        io[i].devPtr_base = buf;
        io[i].devPtr_offset = 0;
        io[i].file_offset = (off_t)i * 4096;
        io[i].size = 4096;
        io[i].opcode = UGDS_READ;
        io[i].cookie = NULL;
    }
    CHECK_ERR(uGDSBatchIOSubmit(b, 0, io, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, NULL, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSubmit(NULL, 4, io, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSubmit(b, 5, io, 0), UGDS_BATCH_CAPACITY_EXCEEDED);
    io[2].opcode = (uGDSOpcode_t)9;
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_INVALID_VALUE);
    io[2].opcode = UGDS_READ;
    unsigned char *loose = aligned_alloc(4096, 4096);
    io[1].devPtr_base = loose;
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_MEMORY_NOT_REGISTERED);
    io[1].devPtr_base = buf;
    unsigned nr = 4;
    uGDSIOEvents_t ev[4];
    CHECK_ERR(uGDSBatchIOGetStatus(b, 1, NULL, ev, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOGetStatus(b, 1, &nr, NULL, NULL), UGDS_INVALID_VALUE);
    nr = 2;
    CHECK_ERR(uGDSBatchIOGetStatus(b, 3, &nr, ev, NULL), UGDS_INVALID_VALUE); /* min_nr > room */
    uGDSBatchIODestroy(b);
    uGDSBatchIODestroy(NULL);
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_INVALID_VALUE); /* destroyed */

    /* Stream-ordered I/O: arguments are checked before any stream is touched. */
    size_t size = 4096;
    off_t foff = 0, boff = 0;
    ssize_t done = 0;
    CHECK_ERR(uGDSReadAsync(fh, NULL, &size, &foff, &boff, &done, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSReadAsync(fh, buf, NULL, &foff, &boff, &done, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSWriteAsync(fh, buf, &size, &foff, &boff, NULL, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSReadAsync(fh, loose, &size, &foff, &boff, &done, NULL), UGDS_MEMORY_NOT_REGISTERED);
    CHECK_ERR(uGDSStreamRegisterEx(NULL, (uGDSBackend_t)9), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSStreamDeregister((void *)0x1234), UGDS_INVALID_VALUE);

    /* Deregistration. */
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_MEMORY_NOT_REGISTERED); /* twice */
    uGDSHandleDeregister(fh);
    uGDSHandleDeregister(NULL);
    /* Any use of a deregistered handle. */
    uint64_t cap;
    CHECK_ERR(uGDSGetDeviceCapacity(fh, &cap), UGDS_HANDLE_NOT_REGISTERED);
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, 4), UGDS_HANDLE_NOT_REGISTERED);
    CHECK_ERR(uGDSHandleDeregisterEx(fh, 0), UGDS_HANDLE_NOT_REGISTERED);
    CHECK_RET(uGDSRead(fh, buf, 4096, 0, 0), -UGDS_HANDLE_NOT_REGISTERED);
    CHECK_ERR(uGDSReadAsync(fh, buf, &size, &foff, &boff, &done, NULL), UGDS_HANDLE_NOT_REGISTERED);
    /* The fd can be registered again. */
    CHECK_ERR(uGDSHandleRegister(&fh2, &d), UGDS_SUCCESS);
    CHECK(fh2 != fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    CHECK_ERR(uGDSDriverClose(), UGDS_DRIVER_NOT_INITIALIZED);
    CHECK_ERR(uGDSGetDeviceCapacity(fh2, &cap), UGDS_DRIVER_NOT_INITIALIZED);

    close(fd);
    unlink(path);
    free(buf);
    free(loose);
    return finish("test_errors");
}
