/* cufile_ab: synchronous random reads (or writes) through three libraries
 * in one process, each size measured by every side in turn, round after
 * round, so that a disk whose speed drifts over a minute (the GPU
 * machine's virtio disk: up to 2x) weighs on every side alike. The sides:
 *
 *   nvidia  NVIDIA's libcufile.so.0 (cuFileRead/Write)  NVIDIA_CUFILE=path
 *   cufile  ugds's libcufile.so.0 (cuFileRead/Write)    UGDS_CUFILE=path
 *   api     ugds's own C ABI, libugds.so (uGDSRead/Write) UGDS_LIB=path
 *
 * Each library is loaded with dlopen (RTLD_LOCAL: the two libcufile.so.0
 * answer their own symbols), opens the file with its own descriptor
 * (O_DIRECT) and registers a 64 MiB buffer of its own. A side whose
 * library is not given, or does not load, is left out and said so.
 *
 * Usage: cufile_ab FILE [gpu|host|gpu-write|host-write] [SECONDS] [ROUNDS]
 *   gpu: CUDA device memory (libcuda.so.1, the primary context of device 0);
 *   -write: writes from that memory instead of reads (cuFileWrite,
 *   uGDSWrite), over the file's contents;
 *   host: host memory, 2 MiB-aligned huge pages for every side (or plain
 *   pages for the side CUFILE_AB_PLAIN_SIDE names: how much the placement
 *   of a buffer weighs). SECONDS per side, size and round
 *   [0.5]; ROUNDS [5], the order of the sides rotated each round.
 * Prints every measurement, then per size each side's median MiB/s, the
 * ratios of those medians (cufile/nvidia, cufile/api), and the medians of
 * the ratios within each round (`paired`: the two sides of a ratio read
 * seconds apart, so a drift of the disk between rounds cancels), as
 * `RESULT key value unit`.
 *
 * Build: gcc -std=gnu11 -O2 -I<dir of cufile.h> -I<dir of cuda.h>
 *        -Iinclude bench/cufile/cufile_ab.c -ldl -o cufile_ab
 * (scripts/cufile-ab builds and runs it.) */

#include <cufile.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "ugds.h"

#define MIB (1ul << 20)
#define BUF (64 * MIB)
#define MAX_ROUNDS 64

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* The CUDA driver calls used here, loaded at run time (no CUDA needed to
 * build). */
typedef int (*cu_init_t)(unsigned);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_mem_alloc_t)(uint64_t *, size_t);
static cu_mem_alloc_t cu_mem_alloc;

static int cuda_start(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) {
        fprintf(stderr, "cufile_ab: no libcuda.so.1 (%s)\n", dlerror());
        return -1;
    }
    cu_init_t init = (cu_init_t)dlsym(lib, "cuInit");
    cu_device_get_t dev_get = (cu_device_get_t)dlsym(lib, "cuDeviceGet");
    cu_ctx_retain_t retain = (cu_ctx_retain_t)dlsym(lib, "cuDevicePrimaryCtxRetain");
    cu_ctx_set_t set = (cu_ctx_set_t)dlsym(lib, "cuCtxSetCurrent");
    cu_mem_alloc = (cu_mem_alloc_t)dlsym(lib, "cuMemAlloc_v2");
    int dev = 0;
    void *ctx = NULL;
    if (!init || !dev_get || !retain || !set || !cu_mem_alloc || init(0) || dev_get(&dev, 0) || retain(&ctx, dev) ||
        set(ctx)) {
        fprintf(stderr, "cufile_ab: CUDA did not start\n");
        return -1;
    }
    return 0;
}

static void *alloc_buffer(int gpu, const char *side) {
    if (gpu) {
        uint64_t p = 0;
        return cu_mem_alloc(&p, BUF) == 0 ? (void *)(uintptr_t)p : NULL;
    }
    /* Every side's host buffer placed alike: 2 MiB-aligned, huge pages
     * asked for, touched. (posix_memalign left the first buffer of a
     * process slower to read into than the later ones, by up to 30% at
     * 1 MiB on the development machine: where its pages fell.) */
    const char *plain = getenv("CUFILE_AB_PLAIN_SIDE");
    if (plain && strcmp(plain, side) == 0) {
        void *q = NULL;
        printf("side %s: host buffer on plain pages (posix_memalign)\n", side);
        return posix_memalign(&q, 4096, BUF) == 0 ? memset(q, 0, BUF) : NULL;
    }
    size_t huge = 2 * MIB;
    uint8_t *m = mmap(NULL, BUF + huge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t *p = (uint8_t *)(((uintptr_t)m + huge - 1) & ~(uintptr_t)(huge - 1));
    madvise(p, BUF, MADV_HUGEPAGE);
    return memset(p, 0, BUF);
}

struct side {
    const char *name;
    void *lib;
    int fd;
    void *buf;
    CUfileHandle_t fh;  /* nvidia, cufile */
    uGDSHandle_t ufh;   /* api */
    __typeof__(&cuFileRead) read;
    __typeof__(&cuFileWrite) write;
    __typeof__(&uGDSRead) uread;
    __typeof__(&uGDSWrite) uwrite;
    double mibs[4][MAX_ROUNDS];
};

static int open_cufile_side(struct side *s, const char *env, const char *path, int gpu) {
    const char *lib_path = getenv(env);
    if (!lib_path || !*lib_path) {
        printf("side %s: left out (%s not set)\n", s->name, env);
        return -1;
    }
    s->lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!s->lib) {
        printf("side %s: left out (%s)\n", s->name, dlerror());
        return -1;
    }
    __typeof__(&cuFileDriverOpen) drv_open = (__typeof__(&cuFileDriverOpen))dlsym(s->lib, "cuFileDriverOpen");
    __typeof__(&cuFileHandleRegister) reg =
        (__typeof__(&cuFileHandleRegister))dlsym(s->lib, "cuFileHandleRegister");
    __typeof__(&cuFileBufRegister) buf_reg = (__typeof__(&cuFileBufRegister))dlsym(s->lib, "cuFileBufRegister");
    s->read = (__typeof__(&cuFileRead))dlsym(s->lib, "cuFileRead");
    s->write = (__typeof__(&cuFileWrite))dlsym(s->lib, "cuFileWrite");
    if (!drv_open || !reg || !buf_reg || !s->read || !s->write) {
        printf("side %s: left out (%s lacks cuFile's calls)\n", s->name, lib_path);
        return -1;
    }
    CUfileError_t e = drv_open();
    if (e.err != CU_FILE_SUCCESS) {
        printf("side %s: left out (cuFileDriverOpen: %d)\n", s->name, (int)e.err);
        return -1;
    }
    s->fd = open(path, O_RDWR | O_DIRECT);
    CUfileDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = s->fd;
    if (s->fd < 0 || (e = reg(&s->fh, &d)).err != CU_FILE_SUCCESS) {
        printf("side %s: left out (cuFileHandleRegister: %d, errno %d)\n", s->name, (int)e.err, errno);
        return -1;
    }
    s->buf = alloc_buffer(gpu, s->name);
    if (!s->buf || (e = buf_reg(s->buf, BUF, 0)).err != CU_FILE_SUCCESS) {
        printf("side %s: left out (no registered buffer: %d)\n", s->name, s->buf ? (int)e.err : -1);
        return -1;
    }
    printf("side %s: %s\n", s->name, lib_path);
    return 0;
}

static int open_api_side(struct side *s, const char *path, int gpu) {
    const char *lib_path = getenv("UGDS_LIB");
    if (!lib_path || !*lib_path) {
        printf("side api: left out (UGDS_LIB not set)\n");
        return -1;
    }
    s->lib = dlopen(lib_path, RTLD_NOW | RTLD_LOCAL);
    if (!s->lib) {
        printf("side api: left out (%s)\n", dlerror());
        return -1;
    }
    __typeof__(&uGDSDriverOpen) drv_open = (__typeof__(&uGDSDriverOpen))dlsym(s->lib, "uGDSDriverOpen");
    __typeof__(&uGDSHandleRegister) reg = (__typeof__(&uGDSHandleRegister))dlsym(s->lib, "uGDSHandleRegister");
    __typeof__(&uGDSBufRegister) buf_reg = (__typeof__(&uGDSBufRegister))dlsym(s->lib, "uGDSBufRegister");
    s->uread = (__typeof__(&uGDSRead))dlsym(s->lib, "uGDSRead");
    s->uwrite = (__typeof__(&uGDSWrite))dlsym(s->lib, "uGDSWrite");
    if (!drv_open || !reg || !buf_reg || !s->uread || !s->uwrite || drv_open().err != UGDS_SUCCESS) {
        printf("side api: left out (%s: no driver)\n", lib_path);
        return -1;
    }
    s->fd = open(path, O_RDWR | O_DIRECT);
    uGDSDescr_t d;
    memset(&d, 0, sizeof d);
    d.type = UGDS_HANDLE_TYPE_OPAQUE_FD;
    d.handle.fd = s->fd;
    if (s->fd < 0 || reg(&s->ufh, &d).err != UGDS_SUCCESS) {
        printf("side api: left out (uGDSHandleRegister failed)\n");
        return -1;
    }
    s->buf = alloc_buffer(gpu, s->name);
    if (!s->buf || buf_reg(s->buf, BUF, 0).err != UGDS_SUCCESS) {
        printf("side api: left out (no registered buffer)\n");
        return -1;
    }
    printf("side api: %s\n", lib_path);
    return 0;
}

static uint64_t rng(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dull;
}

/* MiB/s of reads (writes) of `size` at random offsets aligned to it, for
 * `secs` and at least 4 of them; negative on a failed one. */
static double measure(struct side *s, int write, size_t size, uint64_t file_size, double secs, uint64_t seed) {
    uint64_t slots = file_size / size, n = 0;
    double start = now_s(), t;
    do {
        off_t off = (off_t)(rng(&seed) % slots * size);
        off_t at = (off_t)(n % (BUF / size) * size);
        ssize_t r;
        if (write)
            r = s->write ? s->write(s->fh, s->buf, size, off, at) : s->uwrite(s->ufh, s->buf, size, off, at);
        else
            r = s->read ? s->read(s->fh, s->buf, size, off, at) : s->uread(s->ufh, s->buf, size, off, at);
        if (r != (ssize_t)size) {
            fprintf(stderr, "side %s: %s of %zu at %lld returned %zd\n", s->name, write ? "write" : "read", size,
                    (long long)off, r);
            return -1;
        }
        n++;
        t = now_s() - start;
    } while (t < secs || n < 4);
    return n * (double)size / MIB / t;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    double c[MAX_ROUNDS];
    memcpy(c, v, n * sizeof *v);
    qsort(c, n, sizeof *c, by_value);
    return n % 2 ? c[n / 2] : (c[n / 2 - 1] + c[n / 2]) / 2;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [gpu|host|gpu-write|host-write] [SECONDS] [ROUNDS]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    const char *what = argc > 2 ? argv[2] : "gpu";
    int gpu = strncmp(what, "gpu", 3) == 0, write = strstr(what, "-write") != NULL;
    if (strcmp(what, gpu ? (write ? "gpu-write" : "gpu") : (write ? "host-write" : "host")) != 0) {
        fprintf(stderr, "cufile_ab: %s: expected gpu, host, gpu-write or host-write\n", what);
        return 2;
    }
    double secs = argc > 3 ? atof(argv[3]) : 0.5;
    int rounds = argc > 4 ? atoi(argv[4]) : 5;
    if (rounds < 1 || rounds > MAX_ROUNDS || secs <= 0) {
        fprintf(stderr, "cufile_ab: ROUNDS 1..%d, SECONDS above 0\n", MAX_ROUNDS);
        return 2;
    }
    int probe = open(path, O_RDONLY);
    off_t file_size = probe < 0 ? -1 : lseek(probe, 0, SEEK_END);
    if (probe >= 0) close(probe);
    if (file_size < (off_t)(64 * MIB)) {
        fprintf(stderr, "cufile_ab: %s: 64 MiB at least\n", path);
        return 2;
    }
    if (gpu && cuda_start()) return 1;
    struct side all[3] = {{.name = "nvidia"}, {.name = "cufile"}, {.name = "api"}};
    struct side *sides[3];
    int nsides = 0;
    if (open_cufile_side(&all[0], "NVIDIA_CUFILE", path, gpu) == 0) sides[nsides++] = &all[0];
    if (open_cufile_side(&all[1], "UGDS_CUFILE", path, gpu) == 0) sides[nsides++] = &all[1];
    if (open_api_side(&all[2], path, gpu) == 0) sides[nsides++] = &all[2];
    if (nsides == 0) {
        fprintf(stderr, "cufile_ab: no side to measure\n");
        return 1;
    }
    static const size_t sizes[4] = {4096, 65536, MIB, 16 * MIB};
    static const char *names[4] = {"4k", "64k", "1024k", "16384k"};
    /* Also the RESULT keys' prefix. */
    const char *mem = gpu ? (write ? "gpu_write" : "gpu") : (write ? "host_write" : "host");
    printf("%s memory%s, %.2f s per side, size and round, %d rounds, %lld-byte file\n", gpu ? "gpu" : "host",
           write ? ", writes" : "", secs, rounds,
           (long long)file_size);
    for (int z = 0; z < 4; z++) {
        for (int r = 0; r < rounds; r++) {
            printf("%s %6s round %d:", mem, names[z], r + 1);
            for (int k = 0; k < nsides; k++) {
                struct side *s = sides[(k + r) % nsides];
                uint64_t seed = 0x9e3779b97f4a7c15ull ^ ((uint64_t)(z * MAX_ROUNDS + r) << 8 ^ (uint64_t)(s - all));
                double v = measure(s, write, sizes[z], (uint64_t)file_size, secs, seed);
                if (v < 0) return 1;
                s->mibs[z][r] = v;
                printf("  %s %.1f", s->name, v);
            }
            printf(" MiB/s\n");
            fflush(stdout);
        }
    }
    printf("\nmedians of %d rounds, MiB/s:   size", rounds);
    for (int k = 0; k < nsides; k++) printf(" %10s", sides[k]->name);
    printf("   cufile/nvidia  cufile/api   paired: cufile/nvidia  cufile/api\n");
    for (int z = 0; z < 4; z++) {
        double m[3] = {0, 0, 0};
        printf("%32s", names[z]);
        for (int k = 0; k < nsides; k++) {
            m[sides[k] - all] = median(sides[k]->mibs[z], rounds);
            printf(" %10.1f", m[sides[k] - all]);
        }
        if (m[0] > 0 && m[1] > 0) printf("   %13.3f", m[1] / m[0]); else printf("   %13s", "-");
        if (m[2] > 0 && m[1] > 0) printf("  %10.3f", m[1] / m[2]); else printf("  %10s", "-");
        /* The same ratios round by round, then their median. */
        double pair[2] = {0, 0}, q[MAX_ROUNDS];
        for (int j = 0; j < 2; j++) {
            const struct side *over = j == 0 ? &all[0] : &all[2];
            if (m[over - all] <= 0 || m[1] <= 0) continue;
            for (int r = 0; r < rounds; r++) q[r] = all[1].mibs[z][r] / over->mibs[z][r];
            pair[j] = median(q, rounds);
        }
        if (pair[0] > 0) printf("   %21.3f", pair[0]); else printf("   %21s", "-");
        if (pair[1] > 0) printf("  %10.3f\n", pair[1]); else printf("  %10s\n", "-");
        for (int i = 0; i < 3; i++) {
            if (m[i] > 0) printf("RESULT ab_%s_%s_%s_mibs %.3f MiB/s\n", mem, names[z], all[i].name, m[i]);
        }
        if (m[0] > 0 && m[1] > 0) printf("RESULT ab_%s_%s_cufile_over_nvidia %.3f x\n", mem, names[z], m[1] / m[0]);
        if (m[2] > 0 && m[1] > 0) printf("RESULT ab_%s_%s_cufile_over_api %.3f x\n", mem, names[z], m[1] / m[2]);
        if (pair[0] > 0) printf("RESULT ab_%s_%s_paired_cufile_over_nvidia %.3f x\n", mem, names[z], pair[0]);
        if (pair[1] > 0) printf("RESULT ab_%s_%s_paired_cufile_over_api %.3f x\n", mem, names[z], pair[1]);
    }
    return 0;
}
