/* Batch I/O through the C ABI: mixed reads and writes, events by cookie,
 * capacity, BUSY while events are uncollected; data checked in the file. */
#include "common.h"

#define N 64
#define SZ 8192

int main(void) {
    /* The emulated controller over the file, or (UGDS_TEST_KERNEL_PATH=1)
     * the kernel path on it. */
    if (!getenv("UGDS_TEST_KERNEL_PATH"))
        setenv("UGDS_EMULATE", "1", 1);
    setenv("UGDS_EMULATE_BLOCK_SIZE", "4096", 1);
    char path[256];
    int fd = temp_file(path, sizeof path, 8u << 20);
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t fh = open_handle(fd);

    unsigned char *buf = aligned_alloc(4096, 2 * N * SZ);
    CHECK_ERR(uGDSBufRegister(buf, 2 * N * SZ, 0), UGDS_SUCCESS);
    fill(buf, N * SZ, 5, 0);
    uGDSBatchHandle_t b = NULL;
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, N), UGDS_SUCCESS);
    uGDSIOParams_t io[N + 1];
    uGDSIOEvents_t ev[N];
    for (int i = 0; i < N; i++) {
        io[i].devPtr_base = buf;
        io[i].devPtr_offset = (off_t)i * SZ;
        io[i].file_offset = (off_t)i * SZ;
        io[i].size = SZ;
        io[i].opcode = UGDS_WRITE;
        io[i].cookie = (void *)(uintptr_t)(i + 1);
    }
    CHECK_ERR(uGDSBatchIOSubmit(b, N, io, 0), UGDS_SUCCESS);
    /* Uncollected events hold their buffer and the handle. */
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_BUSY);
    CHECK_ERR(uGDSHandleDeregisterEx(fh, 0), UGDS_BUSY);
    unsigned got = 0, nr;
    int seen[N + 1] = {0};
    while (got < N) {
        nr = N;
        struct timespec to = {10, 0};
        CHECK_ERR(uGDSBatchIOGetStatus(b, 1, &nr, ev, &to), UGDS_SUCCESS);
        for (unsigned k = 0; k < nr; k++) {
            uintptr_t c = (uintptr_t)ev[k].cookie;
            CHECK(c >= 1 && c <= N && !seen[c]);
            CHECK(ev[k].status == UGDS_BATCH_COMPLETE && ev[k].ret == SZ);
            if (c >= 1 && c <= N) seen[c] = 1;
        }
        got += nr;
        if (nr == 0) break;
    }
    CHECK(got == N);
    unsigned char *check = malloc(N * SZ);
    CHECK(pread(fd, check, N * SZ, 0) == N * SZ && same(check, N * SZ, 5, 0));

    /* Mixed: even slots read back into the upper half, odd slots rewritten. */
    fill(buf, N * SZ, 6, 0);
    for (int i = 0; i < N; i++) {
        io[i].opcode = (i % 2) ? UGDS_WRITE : UGDS_READ;
        io[i].devPtr_offset = (i % 2) ? (off_t)i * SZ : (off_t)(N + i) * SZ;
    }
    CHECK_ERR(uGDSBatchIOSubmit(b, N, io, 0), UGDS_SUCCESS);
    nr = N;
    CHECK_ERR(uGDSBatchIOGetStatus(b, N, &nr, ev, NULL), UGDS_SUCCESS);
    CHECK(nr == N);
    for (int i = 0; i < N; i += 2) CHECK(same(buf + (N + i) * SZ, SZ, 5, (size_t)i * SZ));
    CHECK(pread(fd, check, SZ, SZ) == SZ && same(check, SZ, 6, SZ));

    /* A vectored request: the first two blocks of the file into two pieces
     * of the buffer, out of order, completed as one event. */
    ugds_segment_t segs[2] = {{buf, (off_t)(N + 10) * SZ, SZ}, {buf, (off_t)(N + 3) * SZ, SZ}};
    ugds_iov_params_t v = {segs, 2, UGDS_READ, 0, (void *)(uintptr_t)77};
    CHECK_ERR(uGDSBatchIOSubmitv(b, 1, &v, 0), UGDS_SUCCESS);
    nr = 1;
    CHECK_ERR(uGDSBatchIOGetStatus(b, 1, &nr, ev, NULL), UGDS_SUCCESS);
    CHECK(nr == 1 && ev[0].cookie == (void *)(uintptr_t)77 && ev[0].status == UGDS_BATCH_COMPLETE && ev[0].ret == 2 * SZ);
    CHECK(same(buf + (N + 10) * SZ, SZ, 5, 0) && same(buf + (N + 3) * SZ, SZ, 6, SZ));
    /* Bad vectored requests submit nothing. */
    ugds_iov_params_t bad[2] = {v, v};
    bad[1].count = 0;
    CHECK_ERR(uGDSBatchIOSubmitv(b, 2, bad, 0), UGDS_INVALID_VALUE);
    unsigned char *stray = malloc(SZ);
    ugds_segment_t unreg[1] = {{stray, 0, SZ}};
    bad[1].segs = unreg;
    bad[1].count = 1;
    CHECK_ERR(uGDSBatchIOSubmitv(b, 2, bad, 0), UGDS_INVALID_VALUE);
    CHECK(strstr(ugds_last_error(), "request 1: segment 0") != NULL);
    free(stray);
    /* The context's totals: N writes, N mixed, one vectored read; the
     * refused submissions count nothing. */
    ugds_request_stats_t st;
    CHECK_ERR(uGDSBatchIOGetStats(b, NULL), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOGetStats(b, &st), UGDS_SUCCESS);
    CHECK(st.submitted == 2 * N + 1 && st.ended == 2 * N + 1 && st.in_flight == 0);
    CHECK(st.bytes_written == (uint64_t)(N + N / 2) * SZ && st.bytes_read == (uint64_t)(N / 2 + 2) * SZ);
    CHECK(st.errors == 0 && st.canceled == 0 && st.timeouts == 0);

    /* More than the context was set up for. */
    io[N] = io[0];
    CHECK_ERR(uGDSBatchIOSubmit(b, N + 1, io, 0), UGDS_BATCH_CAPACITY_EXCEEDED);
    /* A bad request submits nothing. */
    io[3].size = 100;
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_INVALID_VALUE);
    nr = N;
    struct timespec zero = {0, 1000000};
    CHECK_ERR(uGDSBatchIOGetStatus(b, 0, &nr, ev, &zero), UGDS_SUCCESS);
    CHECK(nr == 0);
    CHECK_ERR(uGDSBatchIOCancel(b), UGDS_SUCCESS);
    uGDSBatchIODestroy(b);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    close(fd);
    unlink(path);
    free(buf);
    free(check);
    return finish("test_batch");
}
