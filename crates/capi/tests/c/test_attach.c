/* libugds in a process attached to a controller `ugds serve` owns
 * (UGDS_ATTACH, set by scripts/ctest, which runs the server): handles,
 * memory from uGDSHostAlloc, synchronous and vectored I/O, private memory
 * refused with a clear error. */
#include "common.h"

#define MIB (1u << 20)

int main(void) {
    if (!getenv("UGDS_ATTACH")) {
        fprintf(stderr, "test_attach: UGDS_ATTACH is not set (scripts/ctest runs it beside ugds serve)\n");
        return 2;
    }
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    /* Any descriptor names the handle: the served namespace stands for it. */
    int fd = open("/dev/null", O_RDONLY);
    uGDSHandle_t fh = open_handle(fd);
    uint64_t cap = 0;
    CHECK_ERR(uGDSGetDeviceCapacity(fh, &cap), UGDS_SUCCESS);
    CHECK(cap == 64 * MIB);

    unsigned char *buf = NULL;
    CHECK_ERR(uGDSHostAlloc((void **)&buf, MIB), UGDS_SUCCESS);
    CHECK(buf != NULL && ((uintptr_t)buf & 4095) == 0);
    CHECK_ERR(uGDSBufRegister(buf, MIB, 0), UGDS_SUCCESS);
    fill(buf, MIB, 7, 0);
    CHECK_RET(uGDSWrite(fh, buf, MIB, 3 * MIB, 0), MIB);
    memset(buf, 0, MIB);
    CHECK_RET(uGDSRead(fh, buf, MIB, 3 * MIB, 0), MIB);
    CHECK(same(buf, MIB, 7, 0));
    /* Vectored: two segments of the registered buffer, one command each side. */
    memset(buf, 0, MIB);
    ugds_segment_t segs[2] = {{buf, 8192, 4096}, {buf, 65536, 8192}};
    CHECK_RET(uGDSReadv(fh, segs, 2, 3 * MIB + 4096), 12288);
    CHECK(same(buf + 8192, 4096, 7, 4096) && same(buf + 65536, 8192, 7, 8192));
    /* Freeing registered memory is refused; deregistered, it goes. */
    CHECK_ERR(uGDSHostFree(buf), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    CHECK_ERR(uGDSHostFree(buf), UGDS_SUCCESS);
    CHECK_ERR(uGDSHostFree(buf), UGDS_INVALID_VALUE);

    /* Memory private to this process: the owner cannot map it. */
    unsigned char *priv = aligned_alloc(4096, 65536);
    uGDSError_t e = uGDSBufRegister(priv, 65536, 0);
    if (e.err == UGDS_SUCCESS) {
        CHECK(uGDSRead(fh, priv, 4096, 0, 0) < 0);
        uGDSBufDeregister(priv);
    }
    CHECK(strstr(ugds_last_error(), "private to this process") != NULL);
    free(priv);

    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    close(fd);
    return finish("test_attach");
}
