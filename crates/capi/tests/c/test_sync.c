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

    /* Every byte above, counted on the queues that carried it. */
    size_t nq = 0;
    CHECK_ERR(uGDSGetQueueStats(fh, NULL, 0, &nq), UGDS_SUCCESS);
    CHECK(nq >= 1 && nq <= 64);
    ugds_queue_stats_t qs[64];
    size_t again = 0;
    CHECK_ERR(uGDSGetQueueStats(fh, qs, nq, &again), UGDS_SUCCESS);
    CHECK(again == nq);
    uint64_t rd = 0, wr = 0, sub = 0, done = 0, errs = 0, inflight = 0;
    for (size_t i = 0; i < nq; i++) {
        CHECK(qs[i].qid >= 1 && qs[i].role <= UGDS_QUEUE_LENDABLE);
        rd += qs[i].bytes_read;
        wr += qs[i].bytes_written;
        sub += qs[i].submitted;
        done += qs[i].completed;
        errs += qs[i].errors;
        inflight += qs[i].in_flight;
    }
    CHECK(rd == 65536 + 512 + 300 * 1024 && wr == MIB + 300 * 1024);
    CHECK(sub >= 5 && sub == done && inflight == 0 && errs == 0);
    CHECK_ERR(uGDSGetQueueStats(fh, NULL, 1, &again), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSGetQueueStats(fh, qs, nq, NULL), UGDS_INVALID_VALUE);

    /* Vectored: three pieces of the buffer, out of order, written as one
     * range and read back into other pieces. */
    fill(buf, 3 * 65536, 7, 0);
    ugds_segment_t w[3] = {{buf, 2 * 65536, 65536}, {buf, 0, 4096}, {buf + 65536, 512, 8192}};
    CHECK_RET(uGDSWritev(fh, w, 3, 8 * MIB), 65536 + 4096 + 8192);
    CHECK(pread(fd, check, 65536, 8 * MIB) == 65536 && same(check, 65536, 7, 2 * 65536));
    CHECK(pread(fd, check, 4096, 8 * MIB + 65536) == 4096 && same(check, 4096, 7, 0));
    CHECK(pread(fd, check, 8192, 8 * MIB + 65536 + 4096) == 8192 && same(check, 8192, 7, 65536 + 512));
    memset(buf, 0, MIB);
    ugds_segment_t r[2] = {{buf, 4 * 65536, 4096}, {buf, 0, 65536 + 8192}};
    CHECK_RET(uGDSReadv(fh, r, 2, 8 * MIB), 65536 + 4096 + 8192);
    CHECK(same(buf + 4 * 65536, 4096, 7, 2 * 65536));
    CHECK(same(buf, 61440, 7, 2 * 65536 + 4096) && same(buf + 61440, 4096, 7, 0));
    CHECK(same(buf + 65536, 8192, 7, 65536 + 512));
    /* Bad lists: -EINVAL, nothing read. */
    ugds_segment_t overlap[2] = {{buf, 0, 8192}, {buf, 4096, 4096}};
    CHECK_RET(uGDSReadv(fh, overlap, 2, 0), -EINVAL);
    CHECK(strstr(ugds_last_error(), "overlap") != NULL);
    CHECK_RET(uGDSReadv(fh, r, 0, 0), -EINVAL);
    CHECK_RET(uGDSReadv(fh, r, UGDS_MAX_SEGMENTS + 1, 0), -EINVAL);
    CHECK_RET(uGDSReadv(fh, NULL, 1, 0), -EINVAL);
    unsigned char *stray = malloc(8192);
    ugds_segment_t unreg[2] = {{buf, 0, 4096}, {stray, 0, 4096}};
    CHECK_RET(uGDSReadv(fh, unreg, 2, 0), -EINVAL);
    CHECK(strstr(ugds_last_error(), "segment 1") != NULL);
    ugds_segment_t odd[1] = {{buf, 0, 1000}};
    CHECK_RET(uGDSWritev(fh, odd, 1, 0), -EINVAL);
    free(stray);

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
