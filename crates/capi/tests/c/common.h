/* Helpers shared by the C tests of libugds. */
#ifndef UGDS_TEST_COMMON_H
#define UGDS_TEST_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ugds.h"

static int failures;

#define CHECK(cond)                                                                       \
    do {                                                                                  \
        if (!(cond)) {                                                                    \
            fprintf(stderr, "%s:%d: CHECK(%s) failed (last error: %s)\n", __FILE__, __LINE__, \
                    #cond, ugds_last_error());                                            \
            failures++;                                                                   \
        }                                                                                 \
    } while (0)

#define CHECK_ERR(call, want)                                                                    \
    do {                                                                                         \
        uGDSError_t e_ = (call);                                                                 \
        if (e_.err != (want)) {                                                                  \
            fprintf(stderr, "%s:%d: %s returned %d (%s), want %d (%s); last error: %s\n", __FILE__, \
                    __LINE__, #call, (int)e_.err, UGDS_ERRSTR(e_.err), (int)(want),              \
                    UGDS_ERRSTR(want), ugds_last_error());                                       \
            failures++;                                                                          \
        }                                                                                        \
    } while (0)

#define CHECK_RET(call, want)                                                                       \
    do {                                                                                            \
        ssize_t r_ = (call);                                                                        \
        if (r_ != (ssize_t)(want)) {                                                                \
            fprintf(stderr, "%s:%d: %s returned %zd, want %zd; last error: %s\n", __FILE__, __LINE__, \
                    #call, r_, (ssize_t)(want), ugds_last_error());                                 \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

static inline unsigned char pat(unsigned seed, size_t off) {
    return (unsigned char)((off * 31u) ^ seed ^ (off >> 9));
}

static inline void fill(unsigned char *p, size_t len, unsigned seed, size_t off) {
    for (size_t i = 0; i < len; i++) p[i] = pat(seed, off + i);
}

static inline int same(const unsigned char *p, size_t len, unsigned seed, size_t off) {
    for (size_t i = 0; i < len; i++)
        if (p[i] != pat(seed, off + i)) return 0;
    return 1;
}

/* A temporary file of `size` bytes, opened read-write; its path in `path`. */
static inline int temp_file(char *path, size_t cap, size_t size) {
    const char *dir = getenv("TMPDIR");
    snprintf(path, cap, "%s/ugds-ctest-XXXXXX", dir ? dir : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
        perror("temp file");
        exit(2);
    }
    return fd;
}

/* Registers a handle on `fd` (OPAQUE_FD); fails the test if it cannot. */
static inline uGDSHandle_t open_handle(int fd) {
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    uGDSHandle_t fh = NULL;
    CHECK_ERR(uGDSHandleRegister(&fh, &d), UGDS_SUCCESS);
    return fh;
}

static inline int finish(const char *name) {
    if (failures) {
        fprintf(stderr, "%s: %d failures\n", name, failures);
        return 1;
    }
    printf("%s: ok\n", name);
    return 0;
}

#endif
