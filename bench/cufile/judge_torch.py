"""PyTorch's cuFile binding (torch.cuda.gds.GdsFile) through whichever
libcufile.so.0 the process loads: a CUDA tensor saved and loaded back,
compared; prints the library that served it.

    python3 bench/cufile/judge_torch.py DIR
"""
import os
import sys

from judge_common import Served, loaded_cufile

import torch
import torch.cuda.gds as gds


def main():
    d = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp"
    path = os.path.join(d, f"judge-torch-{os.getpid()}.bin")
    torch.cuda.init()
    served = Served()
    ok = True
    try:
        for n in (4096, 1 << 20, (64 << 20) + 4096, 12345):
            t = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
            f = gds.GdsFile(path, os.O_CREAT | os.O_RDWR)
            f.save_storage(t.untyped_storage(), offset=0)
            back = torch.zeros(n, dtype=torch.uint8, device="cuda")
            f.load_storage(back.untyped_storage(), offset=0)
            del f
            same = torch.equal(t, back)
            on_disk = os.path.getsize(path)
            ok &= same and on_disk == n
            print(f"torch GdsFile {n} bytes: data {'same' if same else 'DIFFERS'}, file {on_disk} bytes")
            os.unlink(path)
        # A tensor registered first (gds_register_buffer), at an offset.
        t = torch.arange(1 << 18, dtype=torch.float32, device="cuda")
        gds.gds_register_buffer(t.untyped_storage())
        f = gds.GdsFile(path, os.O_CREAT | os.O_RDWR)
        f.save_storage(t.untyped_storage(), offset=4096)
        back = torch.empty_like(t)
        f.load_storage(back.untyped_storage(), offset=4096)
        gds.gds_deregister_buffer(t.untyped_storage())
        same = torch.equal(t, back)
        ok &= same
        print(f"torch GdsFile, registered buffer at offset 4096: data {'same' if same else 'DIFFERS'}")
        del f
    finally:
        if os.path.exists(path):
            os.unlink(path)
    print(f"libcufile loaded: {loaded_cufile()}")
    by_ugds = served.report()
    if by_ugds is False:
        ok = False
    print("JUDGE torch", "PASS" if ok else "FAIL", "(served by ugds)" if by_ugds else "")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
