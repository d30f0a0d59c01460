"""The other sides of `scripts/gpu-bench`'s kernel-path table, on the same
file and GPU: the disk's own limit (O_DIRECT `pread`, and `pread` plus a
copy to the GPU, the floor a kernel-path read into GPU memory can reach) and
KvikIO. Synchronous random reads at 4 KiB, 64 KiB, 1 MiB and 16 MiB, offsets
aligned to the size, as `ugds gpu-bench` and `cufile_bench` do. Every figure
is printed as `RESULT key value unit`.

    python3 side_bench.py disk FILE SECONDS
    python3 side_bench.py kvikio FILE SECONDS [cold|warm|threads]

kvikio: KvikIO's `CuFile.read` into a CuPy buffer, in compatibility mode
(POSIX reads through a bounce buffer; set KVIKIO_COMPAT_MODE=ON), which
reads through the page cache: `cold` drops the cache before each size
(root), `warm` reads the file once first. `cold` also reads into host
memory (a page-aligned NumPy array), writes from GPU memory, and runs a
batch of 128 x 4 KiB reads as KvikIO would (128 `pread` futures, then
waiting for all: it has no batch call). `threads` is `cold`'s GPU reads
with the thread pool KVIKIO_NTHREADS sets (KvikIO splits a read into tasks
of 4 MiB across it). KvikIO's stream calls (`raw_read_async`) need cuFile's
stream support, which compatibility mode does not give: no stream figures.
"""

import mmap
import os
import random
import sys
import time

SIZES = [4096, 65536, 1 << 20, 16 << 20]
MIB = 1 << 20


def result(key, value, unit):
    print(f"RESULT {key} {value:.3f} {unit}", flush=True)


def offsets(cap, size, seed=0x9E3779B9):
    rng = random.Random(seed)
    while True:
        yield rng.randrange(cap // size) * size


def drop_caches():
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def disk(path, secs):
    import cupy

    fd = os.open(path, os.O_RDWR | os.O_DIRECT)
    cap = os.fstat(fd).st_size
    host = mmap.mmap(-1, 16 * MIB)  # page-aligned, as O_DIRECT needs
    pinned = cupy.cuda.alloc_pinned_memory(16 * MIB)
    dev = cupy.empty(16 * MIB, dtype=cupy.uint8)
    view = memoryview(host)
    for size in SIZES:
        for with_copy in (False, True):
            it, n, lat = offsets(cap, size), 0, 0.0
            start = time.perf_counter()
            while time.perf_counter() - start < secs or n < 4:
                off = next(it)
                t = time.perf_counter()
                got = os.preadv(fd, [view[:size]], off)
                assert got == size, got
                if with_copy:
                    # Through pinned memory, as a copy engine needs.
                    ctypes_copy(pinned, host, size)
                    cupy.cuda.runtime.memcpy(dev.data.ptr, pinned.ptr, size, 1)
                lat += time.perf_counter() - t
                n += 1
            el = time.perf_counter() - start
            name = "disk_copy" if with_copy else "disk"
            result(f"{name}_{size // 1024}k_mibs", n * size / el / MIB, "MiB/s")
            if size == 4096:
                result(f"{name}_4k_mean", lat / n * 1e6, "us")
        # O_DIRECT pwrite of the same sizes: the disk's own write limit.
        it, n = offsets(cap, size, seed=7), 0
        start = time.perf_counter()
        while time.perf_counter() - start < secs or n < 4:
            got = os.pwritev(fd, [view[:size]], next(it))
            assert got == size, got
            n += 1
        result(f"disk_write_{size // 1024}k_mibs", n * size / (time.perf_counter() - start) / MIB, "MiB/s")
    os.close(fd)


def ctypes_copy(pinned, host, size):
    import ctypes

    src = ctypes.addressof(ctypes.c_char.from_buffer(host))
    ctypes.memmove(pinned.ptr, src, size)


def kvikio_side(path, secs, cache):
    import cupy
    import kvikio

    cap = os.stat(path).st_size
    buf = cupy.empty(64 * MIB, dtype=cupy.uint8)
    if cache == "threads":
        import kvikio.defaults

        result("kvikio_threads_n", float(kvikio.defaults.get("num_threads")), "threads")
    if cache == "warm":
        with open(path, "rb") as f:
            while f.read(64 * MIB):
                pass
    else:
        drop_caches()
    t0 = time.perf_counter()
    f = kvikio.CuFile(path, "r")
    f.read(buf[:4096], 4096, 0)
    result(f"kvikio_{cache}_setup", (time.perf_counter() - t0) * 1e3, "ms")
    for size in SIZES:
        if cache != "warm":
            drop_caches()
        it, n, lat = offsets(cap, size), 0, 0.0
        start = time.perf_counter()
        while time.perf_counter() - start < secs or n < 4:
            off = next(it)
            t = time.perf_counter()
            got = f.read(buf[:size], size, off)
            assert got == size, got
            lat += time.perf_counter() - t
            n += 1
        el = time.perf_counter() - start
        result(f"kvikio_{cache}_{size // 1024}k_mibs", n * size / el / MIB, "MiB/s")
        if size == 4096:
            result(f"kvikio_{cache}_4k_mean", lat / n * 1e6, "us")
    if cache != "cold":
        f.close()
        return
    # Host memory, page-aligned (a slice of an anonymous mapping).
    import numpy

    host_map = mmap.mmap(-1, 16 * MIB)
    host = numpy.frombuffer(host_map, dtype=numpy.uint8)
    for size in SIZES:
        drop_caches()
        it, n = offsets(cap, size, seed=11), 0
        start = time.perf_counter()
        while time.perf_counter() - start < secs or n < 4:
            got = f.read(host[:size], size, next(it))
            assert got == size, got
            n += 1
        result(f"kvikio_host_{size // 1024}k_mibs", n * size / (time.perf_counter() - start) / MIB, "MiB/s")
    # A batch of 128 x 4 KiB reads into GPU memory: 128 futures, then all
    # waited for; the first batch and the median of the next 20.
    it = offsets(cap, 4096, seed=13)
    times = []
    for _ in range(21):
        t = time.perf_counter()
        futs = [f.pread(buf[i * 4096:(i + 1) * 4096], 4096, next(it)) for i in range(128)]
        assert all(x.get() == 4096 for x in futs)
        times.append((time.perf_counter() - t) * 1e3)
    result("kvikio_batch_first", times[0], "ms")
    result("kvikio_batch_steady", sorted(times[1:])[10], "ms")
    f.close()
    # Writes from GPU memory (compatibility mode: into the page cache,
    # then fsync'd once at the end of each size, so that they reach the disk).
    f = kvikio.CuFile(path, "r+")
    for size in SIZES:
        it, n = offsets(cap, size, seed=7), 0
        start = time.perf_counter()
        while time.perf_counter() - start < secs or n < 4:
            got = f.write(buf[:size], size, next(it))
            assert got == size, got
            n += 1
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
        result(f"kvikio_write_{size // 1024}k_mibs", n * size / (time.perf_counter() - start) / MIB, "MiB/s")
    f.close()


if __name__ == "__main__":
    mode, path, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if mode == "disk":
        disk(path, secs)
    elif mode == "kvikio":
        kvikio_side(path, secs, sys.argv[4] if len(sys.argv) > 4 else "cold")
    else:
        sys.exit(f"unknown mode {mode}")
