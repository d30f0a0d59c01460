/* Synchronous I/O through the C ABI on an emulated controller whose
 * namespace is a regular file (UGDS_EMULATE=1): data is checked against the
 * file itself. */
#include "common.h"

#define MIB (1u << 20)

int main(void) {
    /* The emulated controller over the file, or (UGDS_TEST_KERNEL_PATH=1)
     * the kernel path on it. */
    if (!getenv("UGDS_TEST_KERNEL_PATH"))
        setenv("UGDS_EMULATE", "1", 1);
    char path[256];
    int fd = temp_file(path, sizeof path, 16 * MIB);

    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);
    CHECK(fh != NULL && *(int *)fh == fd); /* existing callers read the fd so */
    uint64_t cap = 0;
    CHECK_ERR(uGDSGetDeviceCapacity(fh, &cap), UGDS_SUCCESS);
    CHECK(cap == 16 * MIB);

    unsigned char *buf = aligned_alloc(4096, MIB);
    CHECK_ERR(uGDSBufRegister(buf, MIB, 0), UGDS_SUCCESS);
    fill(buf, MIB, 1, 0);
    CHECK_RET(uGDSWrite(fh, buf, MIB, 2 * MIB, 0), MIB);
    /* The bytes are in the file, at the offset asked. */
    unsigned char *check = malloc(MIB);
    CHECK(pread(fd, check, MIB, 2 * MIB) == MIB && same(check, MIB, 1, 0));
    memset(buf, 0, MIB);
    CHECK_RET(uGDSRead(fh, buf, 65536, 2 * MIB + 4096, 8192), 65536);
    CHECK(same(buf + 8192, 65536, 1, 4096));
    /* An address inside the registration, with an offset. */
    CHECK_RET(uGDSRead(fh, buf + 4096, 512, 2 * MIB, 512), 512);
    CHECK(same(buf + 4096 + 512, 512, 1, 0));

    /* A buffer never registered: registered just for the call. */
    unsigned char *loose = malloc(300 * 1024 + 100);
    fill(loose + 100, 300 * 1024, 2, 0);
    CHECK_RET(uGDSWrite(fh, loose, 300 * 1024, 5 * MIB, 100), 300 * 1024);
    CHECK(pread(fd, check, 300 * 1024, 5 * MIB) == 300 * 1024 && same(check, 300 * 1024, 2, 0));
    memset(loose, 0, 300 * 1024 + 100);
    CHECK_RET(uGDSRead(fh, loose, 300 * 1024, 5 * MIB, 0), 300 * 1024);
    CHECK(same(loose, 300 * 1024, 2, 0));
    /* ...and not left registered. */
    CHECK_ERR(uGDSBufDeregister(loose), UGDS_MEMORY_NOT_REGISTERED);

    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    CHECK_ERR(uGDSHandleDeregisterEx(fh, 0), UGDS_SUCCESS);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    close(fd);
    unlink(path);
    free(buf);
    free(check);
    free(loose);
    return finish("test_sync");
}
