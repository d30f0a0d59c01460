// Every cuFile entry point through libcufile.so.0, with bad input, on host
// memory: a file through the kernel path, or (UGDS_EMULATE=1) the same
// file behind ugds's emulated controller. Built against NVIDIA's cufile.h
// (scripts/cufile-check).
//
// Strict by default: the first difference from what is expected fails.
// With UGDS_CUFILE_REFERENCE=1 (run against NVIDIA's own libcufile, on a
// machine with CUDA) every difference is printed and the run goes on: the
// list is where ugds and cuFile disagree.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cufile.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int reference, emulated, differences, checks;

#define EXPECT(what, got, want)                                                                   \
    do {                                                                                          \
        if (reference) fprintf(stderr, "  %s\n", what); /* where NVIDIA's library stops */         \
        long long g_ = (long long)(got), w_ = (long long)(want);                                  \
        checks++;                                                                                 \
        if (g_ != w_) {                                                                           \
            differences++;                                                                        \
            fprintf(stderr, "%s:%d: %s: got %lld, want %lld\n", __FILE__, __LINE__, what, g_, w_); \
            if (!reference) exit(1);                                                              \
        }                                                                                         \
    } while (0)
#define OK(what, call) EXPECT(what, (call).err, CU_FILE_SUCCESS)
#define ERR(what, call, code) EXPECT(what, (call).err, code)
#define TRUE(what, cond) EXPECT(what, !!(cond), 1)

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)((i * 131 + seed * 7 + (i >> 9)) & 0xff);
}

static char path[256];

static off_t file_size(void) {
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    return st.st_size;
}

int main(void) {
    reference = getenv("UGDS_CUFILE_REFERENCE") && !strcmp(getenv("UGDS_CUFILE_REFERENCE"), "1");
    // Behind ugds's emulated controller the file is a namespace: offsets
    // and sizes are multiples of its block, and it does not grow.
    emulated = getenv("UGDS_EMULATE") && !strcmp(getenv("UGDS_EMULATE"), "1");
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    snprintf(path, sizeof path, "%s/ugds-cufile-test-%d.img", dir, (int)getpid());
    const size_t file_len = 4 << 20;
    unsigned char *init = malloc(file_len);
    fill(init, file_len, 1);
    int w = open(path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    if (w < 0 || write(w, init, file_len) != (ssize_t)file_len) { perror("write the test file"); return 1; }
    close(w);

    // Before the driver opens: the version, properties, parameters.
    int version = 0;
    ERR("GetVersion(NULL)", cuFileGetVersion(NULL), CU_FILE_INVALID_VALUE);
    OK("GetVersion", cuFileGetVersion(&version));
    TRUE("version >= 1.0", version >= 1000);
    EXPECT("UseCount before open", cuFileUseCount(), 0);
    size_t v = 0, lo = 0, hi = 0;
    OK("SetParameterSizeT(IO_BATCHSIZE, 64)", cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, 64));
    OK("GetParameterSizeT(IO_BATCHSIZE)", cuFileGetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, &v));
    EXPECT("the batch size set", v, 64);
    CUfileDrvProps_t props;
    ERR("GetProperties(NULL)", cuFileDriverGetProperties(NULL), CU_FILE_INVALID_VALUE);
    // The driver's properties open it (not counted as a user): parameters
    // are refused from then on, as NVIDIA's library does (1.15.1).
    OK("GetProperties", cuFileDriverGetProperties(&props));
    TRUE("max_batch_io_size > 0", props.max_batch_io_size > 0);
    EXPECT("UseCount after GetProperties", cuFileUseCount(), 0);
    ERR("SetParameterSizeT after GetProperties", cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, 32),
        CU_FILE_DRIVER_ALREADY_OPEN);
    OK("GetParameterSizeT(PROFILE_STATS)", cuFileGetParameterSizeT(CUFILE_PARAM_PROFILE_STATS, &v));
    ERR("GetParameterSizeT(NULL)", cuFileGetParameterSizeT(CUFILE_PARAM_PROFILE_STATS, NULL), CU_FILE_INVALID_VALUE);
    ERR("GetParameterSizeT(99)", cuFileGetParameterSizeT((CUFileSizeTConfigParameter_t)99, &v), CU_FILE_INVALID_VALUE);
    OK("GetParameterMinMaxValue", cuFileGetParameterMinMaxValue(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, &lo, &hi));
    TRUE("batch size bounds", lo <= hi && hi > 0);
    bool b = false;
    OK("GetParameterBool(ALLOW_COMPAT_MODE)", cuFileGetParameterBool(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE, &b));
    char level[64];
    OK("GetParameterString(LOGGING_LEVEL)", cuFileGetParameterString(CUFILE_PARAM_LOGGING_LEVEL, level, sizeof level));
    ERR("GetParameterString(len 0)", cuFileGetParameterString(CUFILE_PARAM_LOGGING_LEVEL, level, 0), CU_FILE_INVALID_VALUE);

    // The driver: opened twice, closed once, counted.
    OK("DriverOpen", cuFileDriverOpen());
    OK("DriverOpen again", cuFileDriverOpen());
    EXPECT("UseCount", cuFileUseCount(), 2);
    OK("DriverClose", cuFileDriverClose());
    EXPECT("UseCount after a close", cuFileUseCount(), 1);
    ERR("SetParameterSizeT once open", cuFileSetParameterSizeT(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE, 32),
        CU_FILE_DRIVER_ALREADY_OPEN);

    // Handles.
    int fd = open(path, O_RDWR | O_DIRECT);
    if (fd < 0) fd = open(path, O_RDWR);  // a filesystem without O_DIRECT (tmpfs)
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    CUfileHandle_t fh = NULL, other = NULL;
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    ERR("HandleRegister(NULL, d)", cuFileHandleRegister(NULL, &d), CU_FILE_INVALID_VALUE);
    ERR("HandleRegister(fh, NULL)", cuFileHandleRegister(&fh, NULL), CU_FILE_INVALID_VALUE);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_WIN32;
    ERR("HandleRegister(WIN32)", cuFileHandleRegister(&fh, &d), CU_FILE_IO_NOT_SUPPORTED);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = -1;
    ERR("HandleRegister(fd -1)", cuFileHandleRegister(&fh, &d), CU_FILE_INVALID_VALUE);
    d.handle.fd = fd;
    // A value of UGDS_EMULATE_BLOCK_SIZE other than 512 or 4096 refuses the
    // handle (read only where the file is emulated).
    if (emulated) {
        setenv("UGDS_EMULATE_BLOCK_SIZE", "0", 1);
        ERR("HandleRegister(UGDS_EMULATE_BLOCK_SIZE=0)", cuFileHandleRegister(&fh, &d), CU_FILE_INVALID_VALUE);
        unsetenv("UGDS_EMULATE_BLOCK_SIZE");
    }
    OK("HandleRegister", cuFileHandleRegister(&fh, &d));
    ERR("HandleRegister twice", cuFileHandleRegister(&other, &d), CU_FILE_HANDLE_ALREADY_REGISTERED);

    // Buffers.
    const size_t len = 1 << 20;
    unsigned char *a = aligned_alloc(4096, len), *c = aligned_alloc(4096, len), *u = malloc(len + 64);
    fill(a, len, 2);
    ERR("BufRegister(NULL)", cuFileBufRegister(NULL, len, 0), CU_FILE_INVALID_VALUE);
    ERR("BufRegister(len 0)", cuFileBufRegister(a, 0, 0), CU_FILE_INVALID_VALUE);
    OK("BufRegister", cuFileBufRegister(a, len, 0));
    ERR("BufRegister twice", cuFileBufRegister(a, len, 0), CU_FILE_MEMORY_ALREADY_REGISTERED);
    OK("BufRegister c", cuFileBufRegister(c, len, 0));
    ERR("BufDeregister(unknown)", cuFileBufDeregister(u), CU_FILE_MEMORY_NOT_REGISTERED);

    // Synchronous I/O: registered, unregistered, unaligned, at and past the end.
    EXPECT("Write 1 MiB", cuFileWrite(fh, a, len, 0, 0), len);
    memset(c, 0, len);
    EXPECT("Read 1 MiB", cuFileRead(fh, c, len, 0, 0), len);
    TRUE("read back what was written", !memcmp(a, c, len));
    memset(u, 0, len);
    EXPECT("Read into unregistered memory", cuFileRead(fh, u + 8, 65536, 1 << 20, 0), 65536);
    TRUE("unregistered read data", !memcmp(u + 8, init + (1 << 20), 65536));
    if (!emulated) {
        EXPECT("Read unaligned", cuFileRead(fh, u, 1000, (1 << 20) + 333, 5), 1000);
        TRUE("unaligned read data", !memcmp(u + 5, init + (1 << 20) + 333, 1000));
        EXPECT("Read into memory at an odd address", cuFileRead(fh, u, 70000, 1 << 20, 3), 70000);
        TRUE("odd address data", !memcmp(u + 3, init + (1 << 20), 70000));
        EXPECT("Read with a buffer offset", cuFileRead(fh, c, 4096, 8192, 4096), 4096);
        TRUE("buffer offset data", !memcmp(c + 4096, a + 8192, 4096));
        fill(u, 777, 3);
        EXPECT("Write unaligned", cuFileWrite(fh, u, 777, 4097, 0), 777);
        EXPECT("Read it back", cuFileRead(fh, c, 777, 4097, 0), 777);
        TRUE("unaligned write data", !memcmp(u, c, 777));
        TRUE("bytes around it kept", cuFileRead(fh, c, 8192, 0, 0) == 8192 && !memcmp(c, a, 4097) &&
                                         !memcmp(c + 4097 + 777, a + 4097 + 777, 8192 - 4097 - 777));
    } else {
        errno = 0;
        EXPECT("Read unaligned (a namespace)", cuFileRead(fh, u, 1000, (1 << 20) + 333, 5), -1);
        EXPECT("  errno", errno, EINVAL);
    }
    EXPECT("Read across the end", cuFileRead(fh, c, 8192, file_len - 4096, 0), 4096);
    TRUE("the last 4 KiB", !memcmp(c, init + file_len - 4096, 4096));
    EXPECT("Read at the end", cuFileRead(fh, c, 4096, file_len, 0), 0);
    if (!emulated) {
        fill(u, 5000, 4);
        EXPECT("Write past the end", cuFileWrite(fh, u, 5000, file_len + 100, 0), 5000);
        EXPECT("the file grew to the write's end", file_size(), file_len + 5100);
        EXPECT("Read the grown part", cuFileRead(fh, c, 5100, file_len, 0), 5100);
        TRUE("a hole, then the data", c[0] == 0 && c[99] == 0 && !memcmp(c + 100, u, 5000));
    } else {
        EXPECT("Write past the end (a namespace)", cuFileWrite(fh, a, 4096, file_len, 0), -CU_FILE_IO_NOT_SUPPORTED);
    }
    EXPECT("Read of 0 bytes", cuFileRead(fh, c, 0, 0, 0), 0);

    // Bad input: nothing moves, nothing aborts.
    errno = 0;
    EXPECT("Read(NULL handle)", cuFileRead(NULL, c, 4096, 0, 0), -1);
    EXPECT("  errno", errno, EINVAL);
    if (!reference) {  // NVIDIA's library crashes here (seen: 1.15.1)
        errno = 0;
        EXPECT("Read(NULL buffer)", cuFileRead(fh, NULL, 4096, 0, 0), -1);
        EXPECT("  errno", errno, EINVAL);
    }
    EXPECT("Read(negative offset)", cuFileRead(fh, c, 4096, -4096, 0), -1);
    EXPECT("Write(negative buffer offset)", cuFileWrite(fh, a, 4096, 0, -1), -1);

#ifndef TEST_CUFILE_NO_READV  // cufile.h before 1.14 has no cuFileReadv
    // Vectored.
    size_t last = emulated ? 3072 : 3000;
    CUfileIOVec_t iov[3] = {{c, 4096}, {c + 65536, 512}, {u, last}};
    const unsigned char *at = init + (2 << 20);
    EXPECT("Readv", cuFileReadv(fh, iov, 3, 2 << 20, 0), 4096 + 512 + last);
    TRUE("Readv data", !memcmp(c, at, 4096) && !memcmp(c + 65536, at + 4096, 512) && !memcmp(u, at + 4608, last));
    fill(c, 4096, 5);
    CUfileIOVec_t wv[2] = {{c, 1024}, {c + 2048, 1024}};
    EXPECT("Writev", cuFileWritev(fh, wv, 2, 3 << 20, 0), 2048);
    EXPECT("read the Writev range", cuFileRead(fh, u, 2048, 3 << 20, 0), 2048);
    TRUE("Writev data", !memcmp(u, c, 1024) && !memcmp(u + 1024, c + 2048, 1024));
    EXPECT("Readv(NULL, 1)", cuFileReadv(fh, NULL, 1, 0, 0), -1);
#endif

    // Batch.
    CUfileBatchHandle_t batch = NULL;
    if (!reference)  // NVIDIA's library crashes here (seen: 1.15.1)
        ERR("BatchIOSetUp(NULL)", cuFileBatchIOSetUp(NULL, 8), CU_FILE_INVALID_VALUE);
    ERR("BatchIOSetUp(0)", cuFileBatchIOSetUp(&batch, 0), CU_FILE_INVALID_VALUE);
    ERR("BatchIOSetUp(over the batch size)", cuFileBatchIOSetUp(&batch, 65), CU_FILE_INVALID_VALUE);
    OK("BatchIOSetUp(16)", cuFileBatchIOSetUp(&batch, 16));
    CUfileIOParams_t io[17];
    memset(io, 0, sizeof io);
    for (int i = 0; i < 17; i++) {
        io[i].mode = CUFILE_BATCH;
        io[i].fh = fh;
        io[i].opcode = CUFILE_READ;
        io[i].u.batch.devPtr_base = c;
        io[i].u.batch.devPtr_offset = i * 4096;
        io[i].u.batch.file_offset = (off_t)(i % 16) * 65536;
        io[i].u.batch.size = 4096;
        io[i].cookie = (void *)(uintptr_t)(100 + i);
    }
    // A refused submission is CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR, as
    // NVIDIA's library answers (1.15.1).
    ERR("BatchIOSubmit(17 > 16)", cuFileBatchIOSubmit(batch, 17, io, 0), CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR);
    ERR("BatchIOSubmit(NULL)", cuFileBatchIOSubmit(batch, 1, NULL, 0), CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR);
    if (!reference) {  // NVIDIA's library accepts an unknown opcode (1.15.1): ugds refuses it
        io[3].opcode = (CUfileOpcode_t)7;
        ERR("BatchIOSubmit(bad opcode)", cuFileBatchIOSubmit(batch, 8, io, 0), CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR);
        io[3].opcode = CUFILE_READ;
    }
    memset(c, 0, len);
    OK("BatchIOSubmit(8)", cuFileBatchIOSubmit(batch, 8, io, 0));
    CUfileIOEvents_t ev[16];
    unsigned nr = 16, got = 0;
    struct timespec ts = {5, 0};
    ERR("BatchIOGetStatus(min_nr > nr)", cuFileBatchIOGetStatus(batch, 17, &nr, ev, &ts), CU_FILE_INVALID_VALUE);
    while (got < 8) {
        nr = 16;
        OK("BatchIOGetStatus", cuFileBatchIOGetStatus(batch, 8 - got, &nr, ev + got, &ts));
        if (nr == 0) break;
        got += nr;
    }
    EXPECT("events", got, 8);
    for (unsigned i = 0; i < got; i++) {
        EXPECT("event status", ev[i].status, CUFILE_COMPLETE);
        EXPECT("event bytes", ev[i].ret, 4096);
        uintptr_t k = (uintptr_t)ev[i].cookie - 100;
        TRUE("event cookie", k < 8);
        if (k < 8) {
            const unsigned char *want = a + k * 65536;
            TRUE("batch read data", !memcmp(c + k * 4096, want, 4096));
        }
    }
    // Requests off the block beside an aligned one: moved as cuFileRead and
    // cuFileWrite move them (through the page cache; a namespace refuses).
    {
        CUfileIOParams_t mix[3];
        memset(mix, 0, sizeof mix);
        memset(u, 0, 8192);
        memset(c, 0, 4096);
        fill(u + 6000, 300, 6);
        const off_t wat = (3 << 20) + (1 << 19) + 7;
        for (int i = 0; i < 3; i++) {
            mix[i].mode = CUFILE_BATCH;
            mix[i].fh = fh;
            mix[i].opcode = i == 2 ? CUFILE_WRITE : CUFILE_READ;
            mix[i].cookie = (void *)(uintptr_t)(200 + i);
        }
        mix[0].u.batch = (__typeof__(mix[0].u.batch)){u, (1 << 20) + 333, 5, 1000};
        mix[1].u.batch = (__typeof__(mix[0].u.batch)){c, (1 << 20) + 65536, 0, 4096};
        mix[2].u.batch = (__typeof__(mix[0].u.batch)){u, wat, 6000, 300};
        OK("BatchIOSubmit(unaligned)", cuFileBatchIOSubmit(batch, 3, mix, 0));
        got = 0;
        while (got < 3) {
            nr = 16;
            OK("BatchIOGetStatus(unaligned)", cuFileBatchIOGetStatus(batch, 3 - got, &nr, ev + got, &ts));
            if (nr == 0) break;
            got += nr;
        }
        EXPECT("unaligned batch events", got, 3);
        for (unsigned i = 0; i < got; i++) {
            uintptr_t k = (uintptr_t)ev[i].cookie - 200;
            if (k == 1 || !emulated) {
                EXPECT("unaligned batch status", ev[i].status, CUFILE_COMPLETE);
                EXPECT("unaligned batch bytes", ev[i].ret, k == 0 ? 1000 : k == 1 ? 4096 : 300);
            } else {
                EXPECT("unaligned batch status (a namespace)", ev[i].status, CUFILE_FAILED);
                EXPECT("unaligned batch ret (a namespace)", (ssize_t)ev[i].ret, -EINVAL);
            }
        }
        TRUE("aligned batch data beside them", !memcmp(c, init + (1 << 20) + 65536, 4096));
        if (!emulated) {
            TRUE("unaligned batch read data", !memcmp(u + 5, init + (1 << 20) + 333, 1000));
            EXPECT("read the unaligned batch write", cuFileRead(fh, c, 300, wat, 0), 300);
            TRUE("unaligned batch write data", !memcmp(c, u + 6000, 300));
        }
    }
    OK("BatchIOCancel", cuFileBatchIOCancel(batch));
    cuFileBatchIODestroy(batch);
    cuFileBatchIODestroy(NULL);
    nr = 16;
    ERR("BatchIOGetStatus after Destroy", cuFileBatchIOGetStatus(batch, 0, &nr, ev, &ts),
        CU_FILE_INTERNAL_BATCH_GETSTATUS_ERROR);
    ERR("BatchIOSubmit after Destroy", cuFileBatchIOSubmit(batch, 1, io, 0), CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR);
    OK("BatchIOCancel after Destroy (nothing left to cancel)", cuFileBatchIOCancel(batch));

    // Statistics.
    ERR("SetStatsLevel(5)", cuFileSetStatsLevel(5), CU_FILE_INVALID_VALUE);
    OK("SetStatsLevel(1)", cuFileSetStatsLevel(1));
    int sl = -1;
    OK("GetStatsLevel", cuFileGetStatsLevel(&sl));
    EXPECT("the stats level", sl, 1);
    OK("StatsReset", cuFileStatsReset());
    OK("StatsStart", cuFileStatsStart());
    EXPECT("a counted read", cuFileRead(fh, c, 65536, 0, 0), 65536);
    CUfileStatsLevel1_t s1;
    memset(&s1, 0, sizeof s1);
    OK("GetStatsL1", cuFileGetStatsL1(&s1));
    TRUE("read_ops.ok", s1.read_ops.ok >= 1);
    TRUE("read_bytes", s1.read_bytes >= 65536);
    OK("StatsStop", cuFileStatsStop());
    CUfileStatsLevel2_t s2;
    ERR("GetStatsL2 at level 1", cuFileGetStatsL2(&s2), CU_FILE_INVALID_VALUE);
    OK("SetStatsLevel(0)", cuFileSetStatsLevel(0));

    // Deregistration, then every use of what is gone.
    OK("BufDeregister", cuFileBufDeregister(a));
    ERR("BufDeregister twice", cuFileBufDeregister(a), CU_FILE_MEMORY_NOT_REGISTERED);
    EXPECT("Read into deregistered (now unregistered) memory", cuFileRead(fh, a, 4096, 0, 0), 4096);
    cuFileHandleDeregister(fh);
    cuFileHandleDeregister(NULL);
    errno = 0;
    EXPECT("Read on a deregistered handle", cuFileRead(fh, c, 4096, 0, 0), -1);
    EXPECT("its errno (the cuFile code, as NVIDIA's library sets it)", errno, CU_FILE_HANDLE_NOT_REGISTERED);
    OK("BufDeregister c", cuFileBufDeregister(c));
    OK("DriverClose", cuFileDriverClose());
    EXPECT("UseCount after the last close", cuFileUseCount(), 0);
    ERR("DriverClose when closed", cuFileDriverClose(), CU_FILE_DRIVER_NOT_INITIALIZED);
    close(fd);
    unlink(path);
    free(init);
    free(a);
    free(c);
    free(u);
    printf("test_cufile: %d checks, %d differences%s\n", checks, differences,
           reference ? " (reference mode: differences listed above)" : "");
    return reference ? 0 : differences != 0;
}
