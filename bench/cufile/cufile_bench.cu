// cufile_bench: NVIDIA cuFile on CUDA device memory, in the shape of
// `ugds gpu-bench`, so the two print comparable figures.
//
// Build (on a machine with the CUDA toolkit and libcufile):
//   nvcc -O2 -o cufile_bench cufile_bench.cu -lcufile -lcuda
// Run:  cufile_bench FILE [SECONDS] [COMPUTE_US]
// FILE is read with O_DIRECT; its upper half is overwritten by the
// overlap experiment. Every figure is printed as `RESULT key value unit`.

#include <cuda.h>
#include <cuda_runtime.h>
#include <cufile.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <string>
#include <vector>
#include <algorithm>

#define MIB (1ul << 20)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void check_cu(CUfileError_t e, const char *what) {
    if (e.err != CU_FILE_SUCCESS) {
        fprintf(stderr, "%s failed: cuFile error %d, CUresult %d\n", what, (int)e.err, (int)e.cu_err);
        exit(1);
    }
}

static void check_rt(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

static void result(const char *key, double v, const char *unit) { printf("RESULT %s %.3f %s\n", key, v, unit); }

// Latencies in microseconds, for scripts/gpu-bench to turn into percentiles
// with `ugds hist`: the same HDR histogram the ugds side uses.
static void samples(const char *key, const std::vector<double> &us) {
    printf("SAMPLES %s", key);
    for (double v : us) printf(" %.3f", v);
    printf("\n");
}

__global__ void spin(uint64_t ns) {
    uint64_t start, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - start < ns);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s FILE [SECONDS] [COMPUTE_US]\n", argv[0]);
        return 2;
    }
    const char *path = argv[1];
    double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    uint64_t compute_us = argc > 3 ? strtoull(argv[3], 0, 10) : 500;

    // The CUDA context exists and the buffer is allocated before timing.
    check_rt(cudaSetDevice(0), "cudaSetDevice");
    check_rt(cudaFree(0), "cudaFree(0)");
    void *gpu;
    size_t buf_len = 64 * MIB;
    check_rt(cudaMalloc(&gpu, buf_len), "cudaMalloc");

    double t0 = now_ms();
    check_cu(cuFileDriverOpen(), "cuFileDriverOpen");
    double t_open = now_ms();
    int fd = open(path, O_RDWR | O_DIRECT);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    CUfileDescr_t descr;
    memset(&descr, 0, sizeof descr);
    descr.handle.fd = fd;
    descr.type = CU_FILE_HANDLE_TYPE_OPAQUE_FD;
    CUfileHandle_t fh;
    check_cu(cuFileHandleRegister(&fh, &descr), "cuFileHandleRegister");
    double t_handle = now_ms();
    check_cu(cuFileBufRegister(gpu, buf_len, 0), "cuFileBufRegister");
    double t_reg = now_ms();
    if (cuFileRead(fh, gpu, 4096, 0, 0) != 4096) {
        fprintf(stderr, "first read failed\n");
        return 1;
    }
    double t_first = now_ms();
    printf("set-up: driver open %.3f ms, handle %.3f ms, 64 MiB GPU buffer registered %.3f ms, first 4 KiB read done at %.3f ms\n",
           t_open - t0, t_handle - t_open, t_reg - t_handle, t_first - t0);
    result("setup_total", t_first - t0, "ms");
    result("setup_buf_register", t_reg - t_handle, "ms");

    struct stat st;
    fstat(fd, &st);
    uint64_t cap = st.st_size;
    size_t sizes[] = {4096, 65536, MIB, 16 * MIB};
    for (int k = 0; k < 4; k++) {
        size_t size = sizes[k];
        std::vector<double> lat;
        double start = now_ms();
        while (now_ms() - start < seconds * 1e3 || lat.size() < 4) {
            off_t off = (rng() % (cap / size)) * size;
            double s = now_ms();
            ssize_t n = cuFileRead(fh, gpu, size, off, 0);
            if (n != (ssize_t)size) {
                fprintf(stderr, "read %zu at %lld: %zd\n", size, (long long)off, n);
                return 1;
            }
            lat.push_back(now_ms() - s);
        }
        double secs = (now_ms() - start) / 1e3;
        double mibs = lat.size() * (double)size / secs / MIB;
        double mean = 0;
        for (double l : lat) mean += l;
        mean /= lat.size();
        std::sort(lat.begin(), lat.end());
        double p99 = lat[(size_t)(lat.size() * 0.99)];
        printf("sync read %8zu: %8.1f MiB/s, mean %.1f us, p99 %.1f us (%zu reads)\n", size, mibs, mean * 1e3, p99 * 1e3,
               lat.size());
        char key[64];
        snprintf(key, sizeof key, "sync_read_%zuk_mibs", size / 1024);
        result(key, mibs, "MiB/s");
        if (size == 4096) {
            result("sync_read_4k_mean", mean * 1e3, "us");
            std::vector<double> us;
            for (double l : lat) us.push_back(l * 1e3);
            samples("sync_read_4k", us);
        }
    }

    // Synchronous writes from GPU memory, and reads into (pinned, registered)
    // host memory, at the same sizes: one request at a time, random offsets
    // aligned to the size.
    void *host = nullptr;
    check_rt(cudaMallocHost(&host, buf_len), "cudaMallocHost");
    bool host_ok = cuFileBufRegister(host, buf_len, 0).err == CU_FILE_SUCCESS;
    if (!host_ok) printf("host memory not registered with cuFile; host reads use it unregistered\n");
    struct Case { const char *name; bool write; void *buf; };
    Case cases[] = {{"sync_write", true, gpu}, {"host_read", false, host}};
    for (const Case &c : cases) {
        for (int k = 0; k < 4; k++) {
            size_t size = sizes[k];
            size_t n = 0;
            double start = now_ms();
            bool failed = false;
            while (now_ms() - start < seconds * 1e3 || n < 4) {
                off_t off = (rng() % (cap / size)) * size;
                ssize_t got = c.write ? cuFileWrite(fh, c.buf, size, off, 0) : cuFileRead(fh, c.buf, size, off, 0);
                if (got != (ssize_t)size) {
                    fprintf(stderr, "%s %zu at %lld: %zd\n", c.name, size, (long long)off, got);
                    failed = true;
                    break;
                }
                n++;
            }
            if (failed) break;
            double mibs = n * (double)size / ((now_ms() - start) / 1e3) / MIB;
            printf("%s %8zu: %8.1f MiB/s (%zu)\n", c.name, size, mibs, n);
            char key[64];
            snprintf(key, sizeof key, "%s_%zuk_mibs", c.name, size / 1024);
            result(key, mibs, "MiB/s");
        }
    }
    if (host_ok) cuFileBufDeregister(host);
    cudaFreeHost(host);

    // One stream against the same 16 MiB reads synchronously.
    cudaStream_t s;
    check_rt(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    check_cu(cuFileStreamRegister(s, 15), "cuFileStreamRegister");  // all parameters fixed and aligned: its fast case
    const int reads = 32;
    size_t sz[reads];
    off_t foff[reads], boff[reads];
    ssize_t done[reads];
    /* Sync and stream alternate; the figures are medians of 7 pairs. */
    std::vector<double> syncs, streams, kept;
    for (int rep = 0; rep < 7; rep++) {
        double start = now_ms();
        for (int i = 0; i < reads; i++)
            if (cuFileRead(fh, gpu, 16 * MIB, (off_t)i * 16 * MIB, (i % 4) * 16 * MIB) != (ssize_t)(16 * MIB)) return 1;
        double sync = reads * 16 / ((now_ms() - start) / 1e3);
        start = now_ms();
        for (int i = 0; i < reads; i++) {
            sz[i] = 16 * MIB;
            foff[i] = (off_t)i * 16 * MIB;
            boff[i] = (i % 4) * 16 * MIB;
            check_cu(cuFileReadAsync(fh, gpu, &sz[i], &foff[i], &boff[i], &done[i], s), "cuFileReadAsync");
        }
        check_rt(cudaStreamSynchronize(s), "sync");
        double stream = reads * 16 / ((now_ms() - start) / 1e3);
        for (int i = 0; i < reads; i++)
            if (done[i] != (ssize_t)(16 * MIB)) return 1;
        syncs.push_back(sync);
        streams.push_back(stream);
        kept.push_back(100 * stream / sync);
    }
    std::sort(syncs.begin(), syncs.end());
    std::sort(streams.begin(), streams.end());
    std::sort(kept.begin(), kept.end());
    double best_sync = syncs[3], best_stream = streams[3], best_kept = kept[3];
    printf("one stream, %d x 16 MiB: sync %.1f MiB/s, stream %.1f MiB/s, %.1f%% kept (medians of 7 alternating runs)\n",
           reads, best_sync, best_stream, best_kept);
    result("sync_16m_mibs", best_sync, "MiB/s");
    result("stream_16m_mibs", best_stream, "MiB/s");
    result("stream_16m_kept", best_kept, "%");

    // What one stream operation costs: 2000 x 4 KiB reads on one stream,
    // then the same synchronously.
    {
        const int n = 2000;
        std::vector<size_t> osz(n, 4096);
        std::vector<off_t> ofo(n), obo(n, 0);
        std::vector<ssize_t> od(n);
        for (int i = 0; i < n; i++) ofo[i] = (off_t)i * 8192;
        double start = now_ms();
        for (int i = 0; i < n; i++)
            check_cu(cuFileReadAsync(fh, gpu, &osz[i], &ofo[i], &obo[i], &od[i], s), "cuFileReadAsync");
        check_rt(cudaStreamSynchronize(s), "sync");
        double op = (now_ms() - start) * 1e3 / n;
        for (int i = 0; i < n; i++)
            if (od[i] != 4096) return 1;
        start = now_ms();
        for (int i = 0; i < n; i++)
            if (cuFileRead(fh, gpu, 4096, (off_t)i * 8192, 0) != 4096) return 1;
        double sync = (now_ms() - start) * 1e3 / n;
        printf("stream operation, %d in a row: %.1f us with a 4 KiB read (sync 4 KiB read %.1f us)\n", n, op, sync);
        result("stream_op_4k", op, "us");
        result("sync_op_4k", sync, "us");
    }

    // Overlap: 16 x 1 MiB writes + compute.
    cudaStream_t c;
    check_rt(cudaStreamCreateWithFlags(&c, cudaStreamNonBlocking), "cudaStreamCreate");
    uint64_t ns = compute_us * 1000;
    off_t base = cap / 2;
    size_t wsz[16];
    off_t wfoff[16], wboff[16];
    ssize_t wdone[16];
    auto write = [&](int i) {
        wsz[i] = MIB;
        wfoff[i] = base + (off_t)i * MIB;
        wboff[i] = (off_t)i * MIB;
        check_cu(cuFileWriteAsync(fh, gpu, &wsz[i], &wfoff[i], &wboff[i], &wdone[i], s), "cuFileWriteAsync");
    };
    write(0);
    spin<<<1, 1, 0, c>>>(ns);
    cudaStreamSynchronize(s);
    cudaStreamSynchronize(c);
    // Each side alone: what a perfect overlap would take is the larger.
    double t_io = now_ms();
    for (int i = 0; i < 16; i++) write(i);
    cudaStreamSynchronize(s);
    t_io = now_ms() - t_io;
    double t_compute = now_ms();
    for (int i = 0; i < 16; i++) spin<<<1, 1, 0, c>>>(ns);
    cudaStreamSynchronize(c);
    t_compute = now_ms() - t_compute;
    result("overlap_io_alone", t_io, "ms");
    result("overlap_compute_alone", t_compute, "ms");
    const char *names[] = {"sequential", "per_io_overlap", "pipelined"};
    double took[3];
    for (int sch = 0; sch < 3; sch++) {
        double start = now_ms();
        for (int i = 0; i < 16; i++) {
            write(i);
            if (sch == 0) {
                cudaStreamSynchronize(s);
                spin<<<1, 1, 0, c>>>(ns);
                cudaStreamSynchronize(c);
            } else {
                spin<<<1, 1, 0, c>>>(ns);
                if (sch == 1) {
                    cudaStreamSynchronize(s);
                    cudaStreamSynchronize(c);
                }
            }
        }
        cudaStreamSynchronize(s);
        cudaStreamSynchronize(c);
        took[sch] = now_ms() - start;
        char key[64];
        snprintf(key, sizeof key, "overlap_%s", names[sch]);
        result(key, took[sch], "ms");
    }
    printf("overlap, 16 x (1 MiB write + %llu us compute): sequential %.2f ms, per-I/O overlap %.2f ms, pipelined %.2f ms\n",
           (unsigned long long)compute_us, took[0], took[1], took[2]);

    // Many streams: 16 x 1 MiB reads each.
    int counts[] = {1, 4, 16};
    for (int k = 0; k < 3; k++) {
        int n = counts[k];
        std::vector<cudaStream_t> ss(n);
        for (auto &x : ss) {
            check_rt(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking), "cudaStreamCreate");
            check_cu(cuFileStreamRegister(x, 15), "cuFileStreamRegister");
        }
        std::vector<size_t> msz(n * 16, MIB);
        std::vector<off_t> mfo(n * 16), mbo(n * 16);
        std::vector<ssize_t> md(n * 16);
        double start = now_ms();
        for (int i = 0; i < 16; i++)
            for (int j = 0; j < n; j++) {
                int idx = j * 16 + i;
                mfo[idx] = (off_t)idx * MIB;
                mbo[idx] = (idx % 64) * MIB;
                check_cu(cuFileReadAsync(fh, gpu, &msz[idx], &mfo[idx], &mbo[idx], &md[idx], ss[j]), "cuFileReadAsync");
            }
        for (auto &x : ss) cudaStreamSynchronize(x);
        double mibs = n * 16 / ((now_ms() - start) / 1e3);
        for (auto d : md)
            if (d != (ssize_t)MIB) return 1;
        printf("%2d streams x 16 x 1 MiB reads: %.1f MiB/s\n", n, mibs);
        char key[64];
        snprintf(key, sizeof key, "streams_%d_mibs", n);
        result(key, mibs, "MiB/s");
        for (auto &x : ss) {
            cuFileStreamDeregister(x);
            cudaStreamDestroy(x);
        }
    }

    // A kernel on a stream of its own (launch, then synchronize), with no
    // I/O and while 32 streams each have 4 x 1 MiB reads queued.
    {
        cudaStream_t k;
        check_rt(cudaStreamCreateWithFlags(&k, cudaStreamNonBlocking), "cudaStreamCreate");
        auto sample = [&](std::vector<double> &v) {
            double t = now_ms();
            spin<<<1, 1, 0, k>>>(0);
            check_rt(cudaStreamSynchronize(k), "cudaStreamSynchronize");
            v.push_back((now_ms() - t) * 1e3);
        };
        std::vector<double> idle, busy;
        for (int i = 0; i < 50; i++) sample(idle);
        idle.clear();
        for (int i = 0; i < 500; i++) sample(idle);
        std::sort(idle.begin(), idle.end());
        auto pct = [](std::vector<double> &v, double p) { return v.empty() ? 0.0 : v[(size_t)(p * (v.size() - 1))]; };
        printf("kernel launch to end on its own stream, idle: p50 %.1f us p99 %.1f us\n", pct(idle, 0.5), pct(idle, 0.99));
        samples("neighbour_idle", idle);
        for (int n : {1, 4, 32}) {
        const int per = 128 / n;
        std::vector<cudaStream_t> ss(n);
        for (auto &x : ss) {
            check_rt(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking), "cudaStreamCreate");
            check_cu(cuFileStreamRegister(x, 15), "cuFileStreamRegister");
        }
        std::vector<size_t> nsz(n * per, MIB);
        std::vector<off_t> nfo(n * per), nbo(n * per);
        std::vector<ssize_t> nd(n * per);
        // Two passes, as ugds gpu-bench does; the second is measured.
        for (int pass = 0; pass < 2; pass++) {
            busy.clear();
            for (int i = 0; i < per; i++)
                for (int j = 0; j < n; j++) {
                    int idx = j * per + i;
                    nsz[idx] = MIB;
                    nfo[idx] = (off_t)(idx + 512 + pass * 128) * MIB;
                    nbo[idx] = (idx % 64) * MIB;
                    check_cu(cuFileReadAsync(fh, gpu, &nsz[idx], &nfo[idx], &nbo[idx], &nd[idx], ss[j]),
                             "cuFileReadAsync");
                }
            for (;;) {
                int pending = 0;
                for (auto &x : ss) pending += cudaStreamQuery(x) == cudaErrorNotReady;
                if (!pending || busy.size() >= 20000) break;
                sample(busy);
            }
            for (auto &x : ss) cudaStreamSynchronize(x);
            for (auto d : nd)
                if (d != (ssize_t)MIB) return 1;
        }
        std::sort(busy.begin(), busy.end());
        printf("  while %d stream(s) x %d x 1 MiB reads are queued (%zu kernels, second pass): p50 %.1f us p99 %.1f us\n",
               n, per, busy.size(), pct(busy, 0.5), pct(busy, 0.99));
        char key[64];
        snprintf(key, sizeof key, "neighbour_busy%d", n);
        samples(key, busy);
        for (auto &x : ss) {
            cuFileStreamDeregister(x);
            cudaStreamDestroy(x);
        }
        }
        cudaStreamDestroy(k);
    }

    // Batch: 128 x 4 KiB reads, first batch and steady.
    CUfileBatchHandle_t batch;
    check_cu(cuFileBatchIOSetUp(&batch, 128), "cuFileBatchIOSetUp");
    std::vector<CUfileIOParams_t> io(128);
    std::vector<CUfileIOEvents_t> ev(128);
    for (int i = 0; i < 128; i++) {
        memset(&io[i], 0, sizeof io[i]);
        io[i].mode = CUFILE_BATCH;
        io[i].fh = fh;
        io[i].opcode = CUFILE_READ;
        io[i].cookie = (void *)(uintptr_t)i;
        io[i].u.batch.devPtr_base = gpu;
        io[i].u.batch.devPtr_offset = (off_t)i * 4096;
        io[i].u.batch.size = 4096;
    }
    // 21 batches with the file offsets `offset(batch, request)` gives: the
    // first batch's time and the median of the rest.
    auto rounds = [&](const char *what, const char *key, auto offset) -> bool {
        std::vector<double> times;
        for (int rep = 0; rep < 21; rep++) {
            for (int i = 0; i < 128; i++) io[i].u.batch.file_offset = offset(rep, i);
            double start = now_ms();
            check_cu(cuFileBatchIOSubmit(batch, 128, io.data(), 0), "cuFileBatchIOSubmit");
            unsigned got = 0;
            while (got < 128) {
                unsigned nr = 128 - got;
                struct timespec to = {10, 0};
                check_cu(cuFileBatchIOGetStatus(batch, nr, &nr, ev.data() + got, &to), "cuFileBatchIOGetStatus");
                got += nr;
            }
            times.push_back(now_ms() - start);
            for (int i = 0; i < 128; i++)
                if (ev[i].status != CUFILE_COMPLETE || ev[i].ret != 4096) {
                    fprintf(stderr, "batch event %d: status %d ret %zu\n", i, (int)ev[i].status, (size_t)ev[i].ret);
                    return false;
                }
        }
        std::vector<double> steady(times.begin() + 1, times.end());
        std::sort(steady.begin(), steady.end());
        printf("batch 128 x 4 KiB%s: first %.3f ms, steady median %.3f ms\n", what, times[0], steady[steady.size() / 2]);
        result((std::string(key) + "_first").c_str(), times[0], "ms");
        result((std::string(key) + "_steady").c_str(), steady[steady.size() / 2], "ms");
        return true;
    };
    // The same 128 offsets every batch; then new offsets for every batch
    // (as ugds gpu-bench does): each batch reads data no earlier one read.
    if (!rounds("", "batch", [](int, int i) { return (off_t)i * 8192; })) return 1;
    if (!rounds(", new offsets each", "batch_fresh", [](int rep, int i) { return (off_t)((((off_t)rep * 128 + i) * 40503) % 32768) * 65536 + 36864; }))
        return 1;
    cuFileBatchIODestroy(batch);

    cuFileStreamDeregister(s);
    cuFileBufDeregister(gpu);
    cuFileHandleDeregister(fh);
    close(fd);
    cuFileDriverClose();
    return 0;
}
