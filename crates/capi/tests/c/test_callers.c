/* The C interface under patterns real callers use: batch status with
 * nr = 0, inputs that must not abort the process (run under a ulimit -v of
 * a few GB by scripts/ctest), just-in-time registrations racing on one
 * buffer, a handle deregistered while its batch is alive, and an unlinked
 * file served through the caller's descriptor. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>

#include "common.h"

#define SZ 4096

static uGDSHandle_t fh;
static unsigned char *shared_buf;

static void batch_nr_zero_means_capacity(void) {
    unsigned char *buf = aligned_alloc(4096, 16 * SZ);
    CHECK_ERR(uGDSBufRegister(buf, 16 * SZ, 0), UGDS_SUCCESS);
    uGDSBatchHandle_t b = NULL;
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, 16), UGDS_SUCCESS);
    uGDSIOParams_t io[16];
    uGDSIOEvents_t ev[16];
    for (int i = 0; i < 16; i++) {
        io[i] = (uGDSIOParams_t){.devPtr_base = buf, .devPtr_offset = (off_t)i * SZ, .file_offset = (off_t)i * SZ,
                                 .size = SZ, .opcode = UGDS_READ, .cookie = (void *)(uintptr_t)(i + 1)};
    }
    CHECK_ERR(uGDSBatchIOSubmit(b, 16, io, 0), UGDS_SUCCESS);
    unsigned nr = 0, got = 0;
    struct timespec to = {10, 0};
    /* The existing uGDS's callers: nr = 0 with min_nr > 0. */
    CHECK_ERR(uGDSBatchIOGetStatus(b, 16, &nr, ev, &to), UGDS_SUCCESS);
    CHECK(nr == 16);
    for (unsigned k = 0; k < nr; k++) got += ev[k].status == UGDS_BATCH_COMPLETE && ev[k].ret == SZ;
    CHECK(got == 16);
    /* Room beyond the capacity is the capacity (nothing more can come). */
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_SUCCESS);
    nr = UINT32_MAX;
    CHECK_ERR(uGDSBatchIOGetStatus(b, 4, &nr, ev, &to), UGDS_SUCCESS);
    CHECK(nr == 4);
    uGDSBatchIODestroy(b);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    free(buf);
}

static void huge_inputs_are_refused(void) {
    unsigned char *buf = aligned_alloc(4096, SZ);
    uGDSBatchHandle_t b = NULL;
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, UINT32_MAX), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, UGDS_MAX_BATCH_IO + 1), UGDS_INVALID_VALUE);
    CHECK(b == NULL);
    CHECK_ERR(uGDSBatchIOSetUp(&b, fh, UGDS_MAX_BATCH_IO), UGDS_SUCCESS);
    uGDSBatchIODestroy(b);
    CHECK_ERR(uGDSBufRegister(buf, (size_t)1 << 45, 0), UGDS_INVALID_VALUE);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_MEMORY_NOT_REGISTERED); /* nothing was left */
    CHECK(uGDSRead(fh, buf, (size_t)1 << 45, 0, 0) < 0);
    CHECK(uGDSWrite(fh, buf, (size_t)1 << 45, 0, 0) < 0);
    CHECK(uGDSRead(fh, buf, SZ, 0, INT64_MAX - 100) == -EINVAL);
    CHECK_RET(uGDSRead(fh, buf, SZ, 0, 0), SZ); /* and the handle still works */
    free(buf);
}

static void *jit_reads(void *arg) {
    (void)arg;
    for (int i = 0; i < 3000; i++) {
        ssize_t r = uGDSRead(fh, shared_buf, SZ, (off_t)(i % 64) * SZ, 0);
        if (r != SZ) {
            fprintf(stderr, "jit read %d: %zd (%s)\n", i, r, ugds_last_error());
            return (void *)1;
        }
    }
    return NULL;
}

static void just_in_time_registrations_are_private(void) {
    shared_buf = aligned_alloc(4096, SZ);
    pthread_t t[2];
    void *r[2];
    for (int i = 0; i < 2; i++) CHECK(pthread_create(&t[i], NULL, jit_reads, NULL) == 0);
    for (int i = 0; i < 2; i++) CHECK(pthread_join(t[i], &r[i]) == 0 && r[i] == NULL);
    /* Nothing is left registered: the owner's calls see only its own. */
    CHECK_ERR(uGDSBufDeregister(shared_buf), UGDS_MEMORY_NOT_REGISTERED);
    CHECK_ERR(uGDSBufRegister(shared_buf, SZ, 0), UGDS_SUCCESS);
    /* JIT calls on other memory meanwhile do not touch it. */
    CHECK_ERR(uGDSBufDeregister(shared_buf), UGDS_SUCCESS);
    CHECK_ERR(uGDSBufDeregister(shared_buf), UGDS_MEMORY_NOT_REGISTERED);
    free(shared_buf);
}

static void alarm_handler(int sig) {
    (void)sig;
    static const char m[] = "test_callers: uGDSHandleDeregister hung with a batch alive\n";
    (void)!write(2, m, sizeof m - 1);
    _exit(3);
}

static void handle_deregistered_with_a_live_batch(int fd) {
    uGDSHandle_t h = open_handle(fd);
    unsigned char *buf = aligned_alloc(4096, 4 * SZ);
    CHECK_ERR(uGDSBufRegister(buf, 4 * SZ, 0), UGDS_SUCCESS);
    uGDSBatchHandle_t b = NULL, idle = NULL;
    CHECK_ERR(uGDSBatchIOSetUp(&b, h, 4), UGDS_SUCCESS);
    CHECK_ERR(uGDSBatchIOSetUp(&idle, h, 4), UGDS_SUCCESS);
    uGDSIOParams_t io[4];
    for (int i = 0; i < 4; i++)
        io[i] = (uGDSIOParams_t){.devPtr_base = buf, .devPtr_offset = (off_t)i * SZ, .file_offset = (off_t)i * SZ,
                                 .size = SZ, .opcode = UGDS_READ, .cookie = NULL};
    CHECK_ERR(uGDSBatchIOSubmit(b, 4, io, 0), UGDS_SUCCESS);
    signal(SIGALRM, alarm_handler);
    alarm(30);
    /* Requests are out: not without waiting. */
    CHECK_ERR(uGDSHandleDeregisterEx(h, 0), UGDS_BUSY);
    uGDSHandleDeregister(h); /* the handle's batches go with it */
    alarm(0);
    uGDSIOEvents_t ev[4];
    unsigned nr = 4;
    CHECK_ERR(uGDSBatchIOGetStatus(b, 0, &nr, ev, NULL), UGDS_INVALID_VALUE);
    uGDSBatchIODestroy(b); /* harmless */
    uGDSBatchIODestroy(idle);
    CHECK_RET(uGDSRead(h, buf, SZ, 0, 0), -UGDS_HANDLE_NOT_REGISTERED);
    CHECK_ERR(uGDSBufDeregister(buf), UGDS_SUCCESS);
    free(buf);
}

static void unlinked_file_through_the_callers_fd(void) {
    char path[256], ghost[300];
    int fd = temp_file(path, sizeof path, 1u << 20);
    unsigned char *buf = aligned_alloc(4096, SZ);
    fill(buf, SZ, 3, 0);
    CHECK(pwrite(fd, buf, SZ, 0) == SZ);
    CHECK(unlink(path) == 0);
    uGDSHandle_t h = open_handle(fd);
    unsigned char *got = aligned_alloc(4096, SZ);
    CHECK_RET(uGDSRead(h, got, SZ, 0, 0), SZ);
    CHECK(same(got, SZ, 3, 0));
    fill(buf, SZ, 4, 0);
    CHECK_RET(uGDSWrite(h, buf, SZ, 8 * SZ, 0), SZ);
    uGDSHandleDeregister(h);
    /* The write is in the caller's file, and no file was made by name. */
    CHECK(pread(fd, got, SZ, 8 * SZ) == SZ && same(got, SZ, 4, 0));
    struct stat st;
    snprintf(ghost, sizeof ghost, "%s (deleted)", path);
    CHECK(stat(ghost, &st) != 0 && stat(path, &st) != 0);
    /* A read-only descriptor serves reads; writes fail and change nothing. */
    int ro = temp_file(path, sizeof path, 1u << 20);
    CHECK(pwrite(ro, buf, SZ, 0) == SZ);
    int rofd = open(path, O_RDONLY);
    unlink(path);
    h = open_handle(rofd);
    CHECK_RET(uGDSRead(h, got, SZ, 0, 0), SZ);
    CHECK(same(got, SZ, 4, 0));
    CHECK(uGDSWrite(h, got, SZ, 0, 0) < 0);
    uGDSHandleDeregister(h);
    close(ro);
    close(rofd);
    close(fd);
    free(buf);
    free(got);
}

int main(void) {
    /* The emulated controller over the file, or (UGDS_TEST_KERNEL_PATH=1)
     * the kernel path on it. */
    if (!getenv("UGDS_TEST_KERNEL_PATH"))
        setenv("UGDS_EMULATE", "1", 1);
    setenv("UGDS_EMULATE_BLOCK_SIZE", "4096", 1);
    char path[256];
    int fd = temp_file(path, sizeof path, 4u << 20);
    CHECK_ERR(uGDSDriverOpen(), UGDS_SUCCESS);
    fh = open_handle(fd);
    batch_nr_zero_means_capacity();
    huge_inputs_are_refused();
    just_in_time_registrations_are_private();
    int fd2 = open(path, O_RDWR);
    handle_deregistered_with_a_live_batch(fd2);
    unlinked_file_through_the_callers_fd();
    uGDSHandleDeregister(fh);
    CHECK_ERR(uGDSDriverClose(), UGDS_SUCCESS);
    close(fd2);
    close(fd);
    unlink(path);
    return finish("test_callers");
}
