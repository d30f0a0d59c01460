"""KvikIO with cuFile itself (KVIKIO_COMPAT_MODE=OFF) through whichever
libcufile.so.0 the process loads: CuFile.pwrite/pread of CuPy arrays, and
raw_read_async/raw_write_async on a CUDA stream, data compared; prints the
library that served it.

    KVIKIO_COMPAT_MODE=OFF python3 bench/cufile/judge_kvikio.py DIR
"""
import os
import sys

from judge_common import Served, loaded_cufile

import cupy
import kvikio
import kvikio.defaults


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp"
    path = os.path.join(d, f"judge-kvikio-{os.getpid()}.bin")
    get = getattr(kvikio.defaults, "get", None)
    mode = get("compat_mode") if get else os.environ.get("KVIKIO_COMPAT_MODE")
    print(f"KvikIO {kvikio.__version__}, compat mode {mode}")
    served = Served()
    ok = True
    try:
        for n in (4096, 1 << 20, 100_000, 40 << 20):
            a = cupy.random.randint(0, 255, n, dtype=cupy.uint8)
            with kvikio.CuFile(path, "w") as f:
                written = f.pwrite(a).get()
            b = cupy.zeros_like(a)
            with kvikio.CuFile(path, "r") as f:
                got = f.pread(b).get()
            same = bool((a == b).all())
            ok &= same and written == n and got == n
            print(f"KvikIO pwrite/pread {n} bytes: wrote {written}, read {got}, data {'same' if same else 'DIFFERS'}")
        # Stream-ordered: raw_write_async, then raw_read_async into another array.
        n = 8 << 20
        a = cupy.random.randint(0, 255, n, dtype=cupy.uint8)
        b = cupy.zeros_like(a)
        stream = cupy.cuda.Stream(non_blocking=True)
        with kvikio.CuFile(path, "w+") as f:
            w = f.raw_write_async(a, stream.ptr)
            stream.synchronize()
            wrote = w.check_bytes_done()
            r = f.raw_read_async(b, stream.ptr)
            stream.synchronize()
            read = r.check_bytes_done()
        same = bool((a == b).all())
        ok &= same and wrote == n and read == n
        print(f"KvikIO raw_write_async/raw_read_async {n} bytes: wrote {wrote}, read {read}, data {'same' if same else 'DIFFERS'}")
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print(f"libcufile loaded: {loaded_cufile()}")
    by_ugds = served.report()
    if by_ugds is False:
        ok = False
    print("JUDGE kvikio", "PASS" if ok else "FAIL", "(served by ugds)" if by_ugds else "")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
