"""What the judges share: which libcufile the process loaded, and whether
ugds's served the calls."""
import os


class Served:
    """Whether ugds's libcufile (UGDS_CUFILE_LIB) served the calls: its own
    statistics, level 1, turned on before the judge's first call. The
    process may have loaded another libcufile instead: then ugds's counts
    nothing."""

    def __init__(self):
        import ctypes
        path = os.environ.get("UGDS_CUFILE_LIB")
        self.lib = ctypes.CDLL(path) if path else None
        if self.lib:
            self.lib.cuFileSetStatsLevel(1)

    def report(self):
        if not self.lib:
            return None
        import ctypes
        words = (ctypes.c_uint64 * 78)()
        self.lib.cuFileGetStatsL1(words)
        reads, writes = words[0], words[2]
        print(f"ugds's libcufile served {reads} reads and {writes} writes")
        return reads + writes > 0


def loaded_cufile():
    with open("/proc/self/maps") as m:
        libs = {line.split()[-1] for line in m if "libcufile" in line}
    return ", ".join(sorted(libs)) or "none"

