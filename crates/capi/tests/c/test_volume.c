/* Volumes through the C ABI (uGDSVolumeOpen): three emulated controllers
 * over regular files (UGDS_EMULATE=1), or the kernel path on them
 * (UGDS_TEST_KERNEL_PATH=1), striped and concatenated; data is checked
 * against the member files themselves. */
#include "common.h"

#define KIB 1024u
#define MIB (1u << 20)

int main(void) {
    if (!getenv("UGDS_TEST_KERNEL_PATH"))
        setenv("UGDS_EMULATE", "1", 1);
    char path[3][256];
    int fd[3];
    for (int i = 0; i < 3; i++)
        fd[i] = temp_file(path[i], sizeof path[i], 4 * MIB);

    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    uGDSHandle_t m[3];
    for (int i = 0; i < 3; i++)
        m[i] = open_handle(fd[i]);

    /* Refused: no members, a stripe that is not a power of two, a member
     * given twice, a null handle. */
    uGDSHandle_t vh = NULL;
    CHECK_ERR(uGDSVolumeOpen(&vh, m, 0, 65536), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSVolumeOpen(&vh, m, 3, 3 * 4096), UGDS_INVALID_VALUE);
    uGDSHandle_t twice[2] = {m[0], m[0]};
    CHECK_ERR(uGDSVolumeOpen(&vh, twice, 2, 65536), UGDS_INVALID_VALUE);
    uGDSHandle_t with_null[2] = {m[0], NULL};
    CHECK(uGDSVolumeOpen(&vh, with_null, 2, 65536).err != UGDS_SUCCESS);

    /* Striped, 64 KiB stripes: stripe i on member i % 3. */
    CHECK_ERR(uGDSVolumeOpen(&vh, m, 3, 64 * KIB), UGDS_SUCCESS);
    uint64_t cap = 0;
    CHECK_ERR(uGDSGetDeviceCapacity(vh, &cap), UGDS_SUCCESS);
    CHECK(cap == 12 * MIB);
    unsigned char *buf = aligned_alloc(4096, 2 * MIB);
    CHECK_ERR(uGDSBufRegister(buf, 2 * MIB, 0), UGDS_SUCCESS);
    fill(buf, MIB, 3, 0);
    CHECK_RET(uGDSWrite(vh, buf, MIB, 32 * KIB, 0), MIB);
    unsigned char *check = malloc(64 * KIB);
    for (unsigned s = 0; s < 17; s++) {
        /* Volume bytes [s*64K, s*64K+64K) cut to [32K, 32K+1M). */
        size_t lo = s * 64 * KIB < 32 * KIB ? 32 * KIB : s * 64 * KIB;
        size_t hi = (s + 1) * 64 * KIB > 32 * KIB + MIB ? 32 * KIB + MIB : (s + 1) * 64 * KIB;
        size_t member_off = (s / 3) * 64 * KIB + (lo - s * 64 * KIB);
        CHECK(pread(fd[s % 3], check, hi - lo, member_off) == (ssize_t)(hi - lo));
        CHECK(same(check, hi - lo, 3, lo - 32 * KIB));
    }
    memset(buf, 0, MIB);
    CHECK_RET(uGDSRead(vh, buf, MIB, 32 * KIB, 0), MIB);
    CHECK(same(buf, MIB, 3, 0));
    /* Vectored, across members. */
    ugds_segment_t segs[2] = {{buf, MIB, 96 * KIB}, {buf, MIB + 256 * KIB, 32 * KIB}};
    CHECK_RET(uGDSReadv(vh, segs, 2, 64 * KIB), 128 * KIB);
    CHECK(same(buf + MIB, 96 * KIB, 3, 32 * KIB));
    CHECK(same(buf + MIB + 256 * KIB, 32 * KIB, 3, 128 * KIB));
    /* Bad input changes nothing. */
    CHECK_RET(uGDSWrite(vh, buf, 4096, 100, 0), -EINVAL);
    CHECK_RET(uGDSWrite(vh, buf, 8192, cap - 4096, 0), -EINVAL);
    /* Calls a volume does not take say so. */
    size_t nq = 0;
    CHECK_ERR(uGDSGetQueueStats(vh, NULL, 0, &nq), UGDS_IO_NOT_SUPPORTED);

    /* A batch on the volume: four requests, each across members, one
     * event each; then a vectored one. */
    uGDSBatchHandle_t batch = NULL;
    CHECK_ERR(uGDSBatchIOSetUp(&batch, vh, 8), UGDS_SUCCESS);
    fill(buf, 512 * KIB, 7, 0);
    uGDSIOParams_t ps[4];
    memset(ps, 0, sizeof ps);
    for (int i = 0; i < 4; i++) {
        ps[i].devPtr_base = buf;
        ps[i].devPtr_offset = i * 128 * KIB;
        ps[i].file_offset = 2 * MIB + i * 128 * KIB;
        ps[i].size = 128 * KIB;
        ps[i].opcode = UGDS_WRITE;
        ps[i].cookie = (void *)(uintptr_t)(100 + i);
    }
    CHECK_ERR(uGDSBatchIOSubmit(batch, 4, ps, 0), UGDS_SUCCESS);
    uGDSIOEvents_t ev[8];
    unsigned nr = 8, seen = 0;
    while (seen < 4) {
        nr = 8;
        CHECK_ERR(uGDSBatchIOGetStatus(batch, 1, &nr, ev, NULL), UGDS_SUCCESS);
        for (unsigned i = 0; i < nr; i++) {
            CHECK(ev[i].status == UGDS_BATCH_COMPLETE && ev[i].ret == (ssize_t)(128 * KIB));
            uintptr_t c = (uintptr_t)ev[i].cookie;
            CHECK(c >= 100 && c < 104);
        }
        seen += nr;
    }
    CHECK(seen == 4);
    memset(buf + MIB, 0, 512 * KIB);
    ugds_segment_t vsegs[2] = {{buf, MIB, 256 * KIB}, {buf, MIB + 256 * KIB, 256 * KIB}};
    ugds_iov_params_t iov = {vsegs, 2, UGDS_READ, 2 * MIB, (void *)(uintptr_t)7};
    CHECK_ERR(uGDSBatchIOSubmitv(batch, 1, &iov, 0), UGDS_SUCCESS);
    nr = 8;
    CHECK_ERR(uGDSBatchIOGetStatus(batch, 1, &nr, ev, NULL), UGDS_SUCCESS);
    CHECK(nr == 1 && ev[0].status == UGDS_BATCH_COMPLETE && ev[0].ret == (ssize_t)(512 * KIB));
    CHECK(same(buf + MIB, 512 * KIB, 7, 0));
    ugds_request_stats_t rs;
    CHECK_ERR(uGDSBatchIOGetStats(batch, &rs), UGDS_SUCCESS);
    CHECK(rs.submitted == 5 && rs.ended == 5 && rs.in_flight == 0);
    CHECK(rs.bytes_written == 512 * KIB && rs.bytes_read == 512 * KIB && rs.errors == 0);
    /* Past the end: refused whole, nothing submitted. */
    ps[0].file_offset = cap - 4096;
    CHECK(uGDSBatchIOSubmit(batch, 1, ps, 0).err != UGDS_SUCCESS);
    CHECK_ERR(uGDSBatchIOGetStats(batch, &rs), UGDS_SUCCESS);
    CHECK(rs.submitted == 5);
    uGDSBatchIODestroy(batch);
    /* A member is not deregistered while the volume holds it; it still
     * works on its own. */
    CHECK_ERR(uGDSHandleDeregisterEx(m[1], -1), UGDS_BUSY);
    CHECK_RET(uGDSRead(m[1], buf, 4096, 0, 0), 4096);
    CHECK(same(buf, 4096, 3, 32 * KIB));

    /* Concatenated: the second member's start follows the first's end. */
    uGDSHandle_t cat = NULL;
    uGDSHandle_t two[2] = {m[2], m[0]};
    CHECK_ERR(uGDSVolumeOpen(&cat, two, 2, 0), UGDS_SUCCESS);
    fill(buf, 128 * KIB, 5, 0);
    CHECK_RET(uGDSWrite(cat, buf, 128 * KIB, 4 * MIB - 64 * KIB, 0), 128 * KIB);
    CHECK(pread(fd[2], check, 64 * KIB, 4 * MIB - 64 * KIB) == 64 * KIB && same(check, 64 * KIB, 5, 0));
    CHECK(pread(fd[0], check, 64 * KIB, 0) == 64 * KIB && same(check, 64 * KIB, 5, 64 * KIB));

    /* Volumes first, then their members. */
    uGDSHandleDeregister(vh);
    uGDSHandleDeregister(cat);
    CHECK_RET(uGDSRead(vh, buf, 4096, 0, 0), -UGDS_HANDLE_NOT_REGISTERED);
    for (int i = 0; i < 3; i++)
        CHECK_ERR(uGDSHandleDeregisterEx(m[i], -1), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    for (int i = 0; i < 3; i++) {
        close(fd[i]);
        unlink(path[i]);
    }
    free(buf);
    free(check);
    return finish("test_volume");
}
