#!/usr/bin/env python3
"""4 KiB O_DIRECT reads of FILE after pauses without I/O: how a disk answers
after it was idle (a virtual disk's backend sleeps; the first read after a
process's set-up meets it). Eight reads per pause, each at an offset no
other read names, times in microseconds.

    python3 bench/disk_idle.py FILE [ROUNDS]
"""
import mmap
import os
import sys
import time

path = sys.argv[1]
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
blocks = os.fstat(fd).st_size // 4096
if blocks < 2:
    sys.exit(f"{path}: 8 KiB at least")
buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
n = 0
for r in range(rounds):
    for pause_ms in (0, 1, 10, 100):
        times = []
        for _ in range(8):
            n += 1
            if pause_ms:
                time.sleep(pause_ms / 1000)
            t = time.perf_counter()
            os.preadv(fd, [buf], (n * 7919 * 13 % blocks) * 4096)
            times.append((time.perf_counter() - t) * 1e6)
        med = sorted(times)[len(times) // 2]
        print(f"after {pause_ms:3d} ms idle: median {med:6.0f} us  ({' '.join(f'{v:.0f}' for v in times)})")
