/* Synchronous 4 KiB reads through libugds.so from N threads on one handle:
 * what the C binding costs when threads share a handle (its object table,
 * the handle's and the driver's counts, the registry's lookup).
 *
 *   threads FILE SECONDS N...      (one line of figures per thread count)
 *
 * FILE is read through the kernel path (a regular file; the handle's cache
 * policy decides page cache or O_DIRECT), or through an emulated controller
 * over it with UGDS_EMULATE=1. Each thread has a registered buffer of its
 * own and reads uniformly at random over the first 64 MiB. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ugds.h"

static uGDSHandle_t fh;
static atomic_int stop;
static double seconds;

struct worker {
    pthread_t t;
    unsigned char *buf;
    uint64_t reads, errors;
    unsigned seed;
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *run(void *arg) {
    struct worker *w = arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        off_t off = (off_t)(rand_r(&w->seed) % 16384) * 4096;
        if (uGDSRead(fh, w->buf, 4096, off, 0) == 4096)
            w->reads++;
        else
            w->errors++;
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s FILE SECONDS N...\n", argv[0]);
        return 2;
    }
    seconds = atof(argv[2]);
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror(argv[1]);
        return 1;
    }
    if (uGDSDriverOpen().err != UGDS_SUCCESS) {
        fprintf(stderr, "uGDSDriverOpen: %s\n", ugds_last_error());
        return 1;
    }
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = fd;
    if (uGDSHandleRegister(&fh, &d).err != UGDS_SUCCESS) {
        fprintf(stderr, "uGDSHandleRegister: %s\n", ugds_last_error());
        return 1;
    }
    for (int a = 3; a < argc; a++) {
        int n = atoi(argv[a]);
        struct worker *ws = calloc(n, sizeof *ws);
        for (int i = 0; i < n; i++) {
            ws[i].buf = aligned_alloc(4096, 4096);
            ws[i].seed = 1234 + i;
            if (uGDSBufRegister(ws[i].buf, 4096, 0).err != UGDS_SUCCESS) {
                fprintf(stderr, "uGDSBufRegister: %s\n", ugds_last_error());
                return 1;
            }
        }
        atomic_store(&stop, 0);
        double t0 = now();
        for (int i = 0; i < n; i++)
            pthread_create(&ws[i].t, NULL, run, &ws[i]);
        while (now() - t0 < seconds)
            usleep(10000);
        atomic_store(&stop, 1);
        uint64_t reads = 0, errors = 0;
        for (int i = 0; i < n; i++) {
            pthread_join(ws[i].t, NULL);
            reads += ws[i].reads;
            errors += ws[i].errors;
        }
        double el = now() - t0;
        printf("threads %2d: %10.0f reads/s (%.0f per thread), %llu errors\n", n, reads / el, reads / el / n,
               (unsigned long long)errors);
        for (int i = 0; i < n; i++) {
            uGDSBufDeregister(ws[i].buf);
            free(ws[i].buf);
        }
        free(ws);
    }
    uGDSHandleDeregister(fh);
    uGDSDriverClose();
    return 0;
}
