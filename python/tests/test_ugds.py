"""Tests of the Python API. Host memory runs anywhere (the emulated
controller); CUDA tests need torch with a GPU and say why they skip."""

import ctypes
import errno
import gc
import os
import sys
import threading
import time
import unittest
import weakref

import ugds

try:
    import numpy as np
except ImportError:  # pragma: no cover
    np = None
try:
    import torch

    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    torch = None
    HAVE_CUDA = False

REQUIRE_GPU = os.environ.get("UGDS_REQUIRE_GPU") == "1"


def pattern(seed, n):
    return bytes(((i * 31) ^ seed ^ (i >> 9)) & 0xFF for i in range(n))


class Host(unittest.TestCase):
    def setUp(self):
        self.drv = ugds.Driver()
        self.h = self.drv.open_emulated(size=16 << 20)

    def tearDown(self):
        self.h.close()

    def test_bytearray_round_trip(self):
        mem = bytearray(pattern(1, 1 << 20))
        buf = self.drv.register(mem)
        self.assertFalse(buf.is_device)
        self.assertEqual(self.h.write(buf, 1 << 20, 4096), 1 << 20)
        mem[:] = bytes(1 << 20)
        self.assertEqual(self.h.read(buf, 8192, 4096 + 8192, 512), 8192)
        self.assertEqual(bytes(mem[512 : 512 + 8192]), pattern(1, 1 << 20)[8192 : 2 * 8192])
        self.drv.deregister(buf)

    def test_queue_stats_count_what_was_done(self):
        mem = bytearray(1 << 20)
        buf = self.drv.register(mem)
        before = sum(q["bytes_read"] for q in self.h.queue_stats())
        self.assertEqual(self.h.write(buf, 65536, 0), 65536)
        for _ in range(3):
            self.assertEqual(self.h.read(buf, 8192, 0), 8192)
        stats = self.h.queue_stats()
        self.assertTrue(stats and all(q["role"] in ("sync", "batch", "lendable") for q in stats))
        self.assertEqual(sum(q["bytes_read"] for q in stats) - before, 3 * 8192)
        self.assertEqual(sum(q["bytes_written"] for q in stats), 65536)
        self.assertEqual(sum(q["submitted"] for q in stats), sum(q["completed"] for q in stats))
        self.assertEqual(sum(q["in_flight"] + q["errors"] for q in stats), 0)
        # The emulated controller reaches the buffer itself: nothing copied.
        self.assertEqual(sum(q["copied"] for q in stats), 0)
        self.drv.deregister(buf)

    def test_closing_a_handle_ends_its_batches(self):
        mem = bytearray(1 << 16)
        buf = self.drv.register(mem)
        with self.drv.open_emulated(size=16 << 20) as h:
            b = h.batch(4)
            b.submit([("write", buf, 4096, 0, 0, 1)])
            self.assertEqual(len(b.get_status(1, 1, timeout=5)), 1)
            b.submit([("read", buf, 4096, 0, 0, 2)])
            # Not collected: a close that does not wait is refused, and
            # changes nothing.
            b.get_status(0, 0, timeout=0)
            deadline = time.monotonic() + 5
            while b.stats()["in_flight"] and time.monotonic() < deadline:
                time.sleep(0.001)
            with self.assertRaises(ugds.BusyError):
                h.close("nowait")
            self.assertEqual(len(b.get_status(1, 1, timeout=5)), 1)
            self.assertEqual(b.outstanding, 0)
            v = ugds.Volume([h])
            vb = v.batch(2)
        # The with block closed the handle with `b` and `vb` alive (no
        # wait for them); they are closed with it.
        with self.assertRaises(ugds.ClosedError):
            b.submit([("read", buf, 4096, 0, 0, 3)])
        with self.assertRaises(ugds.ClosedError):
            vb.submit([("read", buf, 4096, 0, 0, 3)])
        with self.assertRaises(ugds.ClosedError):
            b.get_status(1, 1, timeout=1)
        self.assertEqual(b.outstanding, 0)
        with self.assertRaises(ugds.ClosedError):
            h.close()
        del b, vb, v
        self.drv.deregister(buf)

    def test_batch_queues_come_from_the_environment(self):
        os.environ["UGDS_BATCH_QUEUES"] = "3"
        try:
            h = self.drv.open_emulated(size=16 << 20)
        finally:
            del os.environ["UGDS_BATCH_QUEUES"]
        self.assertEqual([q["role"] for q in h.queue_stats()].count("batch"), 3)
        mem = bytearray(1 << 16)
        buf = self.drv.register(mem)
        batches = [h.batch(4) for _ in range(3)]
        for k, b in enumerate(batches):
            b.submit([("write", buf, 4096, k * 4096, k * 4096, k)])
        for b in batches:
            self.assertEqual(len(b.get_status(1, 1, timeout=5)), 1)
        per_queue = [q["submitted"] for q in h.queue_stats() if q["role"] == "batch"]
        self.assertTrue(all(n >= 1 for n in per_queue), per_queue)
        del batches, b
        self.drv.deregister(buf)
        h.close()
        os.environ["UGDS_BATCH_QUEUES"] = "many"
        try:
            with self.assertRaises(ugds.InvalidArgument):
                self.drv.open_emulated(size=16 << 20)
        finally:
            del os.environ["UGDS_BATCH_QUEUES"]

    def test_a_traced_handle_keeps_its_last_commands(self):
        os.environ["UGDS_TRACE"] = "4"
        try:
            h = self.drv.open_emulated(size=16 << 20)
        finally:
            del os.environ["UGDS_TRACE"]
        mem = bytearray(1 << 20)
        buf = self.drv.register(mem)
        for i in range(6):
            self.assertEqual(h.read(buf, 4096, i * 4096), 4096)
        for i in range(3):
            self.assertEqual(h.write(buf, 4096, (6 + i) * 4096), 4096)
        traces = h.trace()
        self.assertTrue(traces and all(len(q["events"]) <= 4 for q in traces), "each queue its last four")
        events = [e for q in traces for e in q["events"]]
        self.assertEqual(sorted(e["slba"] for e in events if e["opcode"] == 1), [48, 56, 64])
        events = [e for e in events if e["opcode"] == 2]
        self.assertTrue(all(e["blocks"] == 8 and e["status"] == (0, 0) for e in events))
        self.assertTrue(all(e["completed_us"] >= e["submitted_us"] for e in events))
        lat = h.queue_latency()
        self.assertEqual(sum(q["commands"] for q in lat), 9)
        self.assertTrue(all(q["p50_us"] is None or q["p50_us"] <= q["max_us"] for q in lat))
        self.assertEqual(self.h.trace(), [], "a handle opened without UGDS_TRACE traces nothing")
        self.drv.deregister(buf)
        h.close()

    def test_vectored_io_moves_segments_as_one_range(self):
        a, b = bytearray(65536), bytearray(65536)
        ba, bb = self.drv.register(a), self.drv.register(b)
        a[0:4096] = pattern(5, 4096)
        b[8192:16384] = pattern(6, 8192)
        self.assertEqual(self.h.writev([(bb, 8192, 8192), (ba, 0, 4096)], 1 << 20), 12288)
        out = bytearray(12288)
        bo = self.drv.register(out)
        self.assertEqual(self.h.read(bo, 12288, 1 << 20), 12288)
        self.assertEqual(bytes(out), pattern(6, 8192) + pattern(5, 4096))
        a[:] = bytes(65536)
        b[:] = bytes(65536)
        self.assertEqual(self.h.readv([(ba, 4096, 4096), (bb, 0, 8192)], 1 << 20), 12288)
        self.assertEqual(bytes(a[4096:8192]), pattern(6, 8192)[:4096])
        self.assertEqual(bytes(b[0:4096]), pattern(6, 8192)[4096:])
        self.assertEqual(bytes(b[4096:8192]), pattern(5, 4096))
        with self.assertRaises(ugds.InvalidArgument):
            self.h.readv([(ba, 0, 8192), (ba, 4096, 4096)], 0)  # overlapping
        with self.assertRaises(ugds.InvalidArgument):
            self.h.readv([], 0)
        for buf in (ba, bb, bo):
            self.drv.deregister(buf)

    def test_vectored_io_in_stream_order(self):
        a, b = bytearray(pattern(4, 65536)), bytearray(65536)
        ba, bb = self.drv.register(a), self.drv.register(b)
        s = ugds.Stream.host()
        at = ugds.Cell(3)  # misaligned if read now
        w = self.h.writev_async([(ba, 8192, 8192), (ba, 0, 4096)], 1 << 20, s)
        gate = threading.Event()
        s.enqueue(gate.wait)  # the stream waits here until the offset is set
        r = self.h.readv_async([(bb, 4096, 12288)], at, s)
        at.value = 1 << 20
        gate.set()
        s.synchronize()
        self.assertEqual((w.bytes, r.bytes), (12288, 12288))
        self.assertEqual(bytes(b[4096:16384]), pattern(4, 65536)[8192:16384] + pattern(4, 65536)[:4096])
        with self.assertRaises(ugds.InvalidArgument):
            self.h.readv_async([(bb, 0, 100)], 0, s)
        st = s.stats()
        self.assertEqual((st["submitted"], st["ended"], st["in_flight"]), (2, 2, 0), st)
        s.set_service("background", "throughput")
        r = self.h.readv_async([(bb, 0, 8192)], 0, s)
        s.synchronize()
        self.assertEqual(r.bytes, 8192)
        with self.assertRaises(ugds.InvalidArgument):
            s.set_service("urgent")
        with self.assertRaises(ugds.InvalidArgument):
            s.set_service("normal", "fastest")
        self.assertEqual((st["bytes_read"], st["bytes_written"], st["errors"]), (12288, 12288, 0), st)
        for buf in (ba, bb):
            self.drv.deregister(buf)

    def test_modes_and_priorities(self):
        data = bytearray(pattern(9, 65536))
        for mode in ("latency", "throughput", "priority", "adaptive"):
            h = self.drv.open_emulated(size=16 << 20, mode=mode)
            buf = self.drv.register(data)
            self.assertEqual(h.write(buf, 65536, 0, priority="background"), 65536)
            data[:] = bytes(65536)
            self.assertEqual(h.read(buf, 65536, 0, priority="critical"), 65536)
            self.assertEqual(bytes(data), pattern(9, 65536), mode)
            stats = [q for q in h.queue_stats() if q["role"] == "sync"]
            self.assertEqual(sum(q["submitted"] for q in stats), 2)
            self.drv.deregister(buf)
            h.close()
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.open_emulated(size=16 << 20, mode="fastest")
        buf = self.drv.register(data)
        before = sum(q["submitted"] for q in self.h.queue_stats())
        with self.assertRaises(ugds.InvalidArgument):
            self.h.read(buf, 4096, 0, priority="urgent")
        self.assertEqual(sum(q["submitted"] for q in self.h.queue_stats()), before, "nothing submitted")
        self.drv.deregister(buf)

    def test_registered_bytearray_cannot_be_resized(self):
        mem = bytearray(65536)
        buf = self.drv.register(mem)
        with self.assertRaises(BufferError):
            mem.extend(bytes(1 << 20))  # would move the storage under the registration
        self.assertEqual(len(mem), 65536)
        self.assertEqual(self.h.read(buf, 65536, 0), 65536)
        self.drv.deregister(buf)
        mem.extend(bytes(4096))  # released with the registration
        self.assertEqual(len(mem), 65536 + 4096)

    def test_collected_buffer_deregisters_itself(self):
        mem = bytearray(8192)
        buf = self.drv.register(mem)
        del buf
        gc.collect()
        buf = self.drv.register(mem)  # not AlreadyRegistered: the old one went
        mem.extend(b"")  # no export is left but the new one's
        self.drv.deregister(buf)
        mem.extend(bytes(1))

    def test_collected_buffer_outlives_a_queued_stream_read(self):
        class Mem(bytearray):  # a bytearray that can be weakly referenced
            pass

        self.h.write(self.drv.register(bytearray(pattern(9, 4096))), 4096, 0)
        gc.collect()
        mem = Mem(4096)
        alive = weakref.ref(mem)
        buf = self.drv.register(mem)
        s = ugds.Stream.host()
        gate = threading.Event()
        s.enqueue(gate.wait)
        r = self.h.read_async(buf, 4096, 0, 0, s)
        view = (ctypes.c_char * 4096).from_address(buf.ptr)
        del buf, mem
        gc.collect()
        # The read is queued: the memory must still be there for it.
        self.assertIsNotNone(alive(), "the memory was freed with a read queued into it")
        self.assertEqual(self.drv.pending_releases, 1)
        gate.set()
        s.synchronize()
        self.assertEqual(r.bytes, 4096, r.error())
        self.assertEqual(bytes(view), pattern(9, 4096))
        del view
        self.assertEqual(self.drv.pending_releases, 0)  # released once the read landed
        gc.collect()
        self.assertIsNone(alive(), "the memory is released after the read")

    def test_a_released_owner_may_drop_other_buffers(self):
        # The memory's owner goes when its read lands; its __del__ drops
        # another Buffer, which deregisters (and sweeps) in turn.
        others = []

        class Mem(bytearray):
            def __del__(self):
                others.clear()

        mem = Mem(4096)
        buf = self.drv.register(mem)
        others.append(self.drv.register(bytearray(4096)))
        s = ugds.Stream.host()
        gate = threading.Event()
        s.enqueue(gate.wait)
        r = self.h.read_async(buf, 4096, 0, 0, s)
        del buf, mem
        gc.collect()
        self.assertEqual(self.drv.pending_releases, 1)
        gate.set()
        s.synchronize()
        self.assertEqual(r.bytes, 4096, r.error())
        self.assertEqual(self.drv.pending_releases, 0)
        self.assertEqual(others, [])

    def test_collected_buffer_outlives_a_batch_in_flight(self):
        class Mem(bytearray):
            pass

        mem = Mem(65536)
        alive = weakref.ref(mem)
        buf = self.drv.register(mem)
        b = self.h.batch(16)
        b.submit([("read", buf, 4096, i * 4096, i * 4096, i) for i in range(16)])
        del buf, mem
        gc.collect()
        if self.drv.pending_releases:  # requests still out: the memory stays
            self.assertIsNotNone(alive())
        b.get_status(16, 16, timeout=10)
        self.assertEqual(self.drv.pending_releases, 0)
        gc.collect()
        self.assertIsNone(alive())

    @unittest.skipIf(torch is None, "torch is not installed")
    def test_torch_tensor_moved_after_registration_is_refused(self):
        t = torch.zeros(4096, dtype=torch.uint8)
        buf = self.drv.register(t)
        self.assertEqual(self.h.read(buf, 4096, 0), 4096)
        t.resize_(1 << 22)  # a new, larger storage
        with self.assertRaises(ugds.InvalidArgument):
            self.h.read(buf, 4096, 0)
        with self.assertRaises(ugds.InvalidArgument):
            self.h.read_async(buf, 4096, 0, 0, ugds.Stream.host())
        self.drv.deregister(buf)
        buf = self.drv.register(t)
        self.assertEqual(self.h.read(buf, 4096, 0), 4096)
        self.drv.deregister(buf)

    @unittest.skipIf(np is None, "numpy is not installed")
    def test_numpy_and_dlpack(self):
        a = np.frombuffer(pattern(2, 65536), dtype=np.uint32).copy()
        buf = self.drv.register(a)
        self.h.write(buf, 65536, 0)
        self.drv.deregister(buf)
        b = np.zeros(65536 // 4, dtype=np.uint32)
        # Through DLPack rather than __array_interface__.
        ptr, n, kind = ugds._from_dlpack(b)
        self.assertEqual((ptr, n, kind), (b.__array_interface__["data"][0], 65536, "host"))
        buf = self.drv.register_raw(ptr, n, kind, b)
        self.h.read(buf, 65536, 0)
        self.assertTrue((a == b).all())
        self.drv.deregister(buf)
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.register(np.zeros((64, 64), dtype=np.uint8)[:, ::2])

    def test_errors_are_typed_and_change_nothing(self):
        mem = bytearray(65536)
        buf = self.drv.register(mem)
        with self.assertRaises(ugds.InvalidArgument) as e:
            self.h.read(buf, 4096, 7)
        self.assertEqual(e.exception.errno, errno.EINVAL)
        with self.assertRaises(ugds.InvalidArgument):
            self.h.read(buf, 1 << 20, 0)  # larger than the buffer
        with self.assertRaises(ugds.InvalidArgument):
            self.h.read(buf, 4096, 32 << 20)  # past the namespace
        with self.assertRaises(ugds.AlreadyRegistered):
            self.drv.register(mem)
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.register(b"read-only bytes")
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.register(object())
        self.drv.deregister(buf)
        with self.assertRaises(ugds.NotRegistered):
            self.drv.deregister(buf)
        with self.assertRaises(ugds.NotRegistered):
            self.h.read(buf, 4096, 0)
        self.assertTrue(issubclass(ugds.BusyError, ugds.Error))
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.open_vfio("0000:00:00.0", interface="vfio-v3")
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.open_vfio("not-a-bdf", interface="cdev")

    def test_batch(self):
        mem = bytearray(128 * 4096)
        buf = self.drv.register(mem)
        mem[:] = pattern(3, len(mem))
        b = self.h.batch(128)
        # One doorbell write for the whole batch.
        self.assertEqual(b.submit([("write", buf, 4096, i * 4096, i * 4096, i) for i in range(128)]), 1)
        ev = b.get_status(128, 128, timeout=10)
        self.assertEqual(sorted(c for c, _, _ in ev), list(range(128)))
        self.assertTrue(all(s == "complete" and r == 4096 for _, s, r in ev))
        mem[:] = bytes(len(mem))
        b.submit([("read", buf, 4096, i * 4096, i * 4096, 1000 + i) for i in range(128)])
        ev = b.get_status(128, 128, timeout=10)
        self.assertEqual(len(ev), 128)
        self.assertEqual(bytes(mem), pattern(3, len(mem)))
        st = b.stats()
        self.assertEqual((st["submitted"], st["ended"], st["in_flight"]), (256, 256, 0))
        self.assertEqual((st["bytes_read"], st["bytes_written"], st["errors"]), (128 * 4096, 128 * 4096, 0))
        # A vectored request: two blocks of the namespace into two pieces.
        mem[:] = bytes(len(mem))
        b.submitv([("read", [(buf, 8 * 4096, 4096), (buf, 2 * 4096, 4096)], 4096, 9)])
        ev = b.get_status(1, 1, timeout=10)
        self.assertEqual(ev, [(9, "complete", 8192)])
        self.assertEqual(bytes(mem[8 * 4096 : 9 * 4096]), pattern(3, len(mem))[4096:8192])
        self.assertEqual(bytes(mem[2 * 4096 : 3 * 4096]), pattern(3, len(mem))[8192:12288])
        with self.assertRaises(ugds.InvalidArgument):
            b.submitv([("read", [], 0, 1)])
        with self.assertRaises(ugds.InvalidArgument):
            b.submit([("read", buf, 4096, 0, 0, 0)] * 129)
        with self.assertRaises(ugds.InvalidArgument):
            b.submit([("copy", buf, 4096, 0, 0, 0)])
        b.cancel()
        self.drv.deregister(buf)

    def test_host_stream_late_binding(self):
        mem = bytearray(pattern(4, 1 << 20))
        buf = self.drv.register(mem)
        self.h.write(buf, 1 << 20, 0)
        mem[:] = bytes(1 << 20)
        s = ugds.Stream.host()
        self.assertEqual(s.wait_mode, "host")
        gate = threading.Event()
        s.enqueue(gate.wait)  # the stream waits here until the values are set
        size, foff = ugds.Cell(0), ugds.Cell(3)  # invalid if bound now
        r = self.h.read_async(buf, size, foff, 0, s)
        size.value, foff.value = 8192, 16384
        gate.set()
        s.synchronize()
        self.assertEqual(r.bytes, 8192, r.error())
        self.assertEqual(bytes(mem[:8192]), pattern(4, 1 << 20)[16384 : 16384 + 8192])
        results = self.h.batch_async([("read", buf, 4096, i * 4096, i * 4096) for i in range(16)], s)
        s.synchronize()
        self.assertTrue(all(x.done and x.bytes == 4096 for x in results))
        bad = self.h.read_async(buf, 4096, 7, 0, s)
        s.synchronize()
        self.assertEqual(bad.bytes, -errno.EINVAL)
        self.drv.deregister(buf)

    def test_threads_share_a_handle(self):
        mems = [bytearray(65536) for _ in range(4)]
        bufs = [self.drv.register(m) for m in mems]

        def work(i):
            for k in range(20):
                mems[i][:] = bytes([i + k]) * 65536
                self.h.write(bufs[i], 65536, (i * 20 + k) * 65536)
                self.h.read(bufs[i], 65536, (i * 20 + k) * 65536)
                assert mems[i][-1] == (i + k) & 0xFF

        ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for b in bufs:
            self.drv.deregister(b)


def gpu_or_skip():
    if HAVE_CUDA:
        return
    why = "torch is not installed" if torch is None else "torch sees no CUDA GPU"
    if REQUIRE_GPU:
        raise AssertionError(f"UGDS_REQUIRE_GPU=1 but {why}")
    sys.stderr.write(f"SKIPPED: CUDA tests ({why})\n")
    raise unittest.SkipTest(why)


class Attached(unittest.TestCase):
    """A process attached to a served controller: here the server is this
    process's (ugds.Server); the tool's tests run them across processes."""

    def setUp(self):
        self.sock = os.path.join(os.environ.get("TMPDIR", "/tmp"), "ugds-py-%d.sock" % os.getpid())
        if os.path.exists(self.sock):
            os.unlink(self.sock)

    def test_attached_round_trip_and_split_shares(self):
        srv = ugds.Server.emulated(self.sock, size=16 << 20, parts=2)
        drv = ugds.Driver()
        a = drv.open_attached(self.sock)
        b = drv.open_attached(self.sock)
        mem = drv.alloc_host(1 << 20)
        buf = drv.register(mem)
        mem[:8192] = pattern(3, 8192)
        self.assertEqual(b.write(buf, 8192, 8 << 20), 8192)
        mem[:8192] = bytes(8192)
        self.assertEqual(b.read(buf, 8192, 8 << 20), 8192)
        self.assertEqual(bytes(mem[:8192]), pattern(3, 8192))
        # Each session has its half: the other half is refused.
        with self.assertRaises(ugds.InvalidArgument):
            a.read(buf, 4096, 8 << 20)
        with self.assertRaises(ugds.InvalidArgument):
            b.read(buf, 4096, 0)
        stats = srv.stats
        self.assertEqual((stats["attached"], stats["bad_requests"]), (2, 0))
        # A third session finds both parts held.
        with self.assertRaises(ugds.Error):
            drv.open_attached(self.sock)
        # Memory private to this process cannot be mapped by the owner.
        priv = bytearray(8192)
        with self.assertRaises(ugds.UnsupportedError):
            pb = drv.register(priv)
            a.read(pb, 4096, 0)
        drv.deregister(buf)
        a.close()
        b.close()
        srv.stop()
        with self.assertRaises(ugds.ClosedError):
            srv.stats


class Volumes(unittest.TestCase):
    def setUp(self):
        self.drv = ugds.Driver()
        self.hs = [self.drv.open_emulated(size=4 << 20) for _ in range(3)]

    def tearDown(self):
        for h in self.hs:
            h.close()

    def test_striped_round_trip_lands_on_the_members(self):
        v = ugds.Volume(self.hs, stripe=65536)
        self.assertEqual((v.capacity, v.block_size, v.stripe), (12 << 20, 512, 65536))
        self.assertEqual(len(v.members), 3)
        want = pattern(4, 1 << 20)
        mem = bytearray(want)
        buf = self.drv.register(mem)
        self.assertEqual(v.write(buf, 1 << 20, 32768), 1 << 20)
        mem[:] = bytes(1 << 20)
        self.assertEqual(v.read(buf, 1 << 20, 32768), 1 << 20)
        self.assertEqual(bytes(mem), want)
        # Volume stripe 1 (bytes 64K..128K) is member 1's first stripe.
        mem[:] = bytes(1 << 20)
        self.assertEqual(self.hs[1].read(buf, 65536, 0), 65536)
        self.assertEqual(bytes(mem[:65536]), want[32768 : 32768 + 65536])
        # Vectored, across members.
        mem[:] = bytes(1 << 20)
        self.assertEqual(v.readv([(buf, 4096, 131072), (buf, 524288, 8192)], 32768), 139264)
        self.assertEqual(bytes(mem[4096 : 4096 + 131072]), want[:131072])
        self.assertEqual(bytes(mem[524288 : 524288 + 8192]), want[131072 : 131072 + 8192])
        self.drv.deregister(buf)

    def test_stream_ordered_on_a_volume(self):
        v = ugds.Volume(self.hs, stripe=65536)
        want = pattern(6, 1 << 20)
        mem = bytearray(want)
        buf = self.drv.register(mem)
        s = ugds.Stream.host()
        gate = threading.Event()
        s.enqueue(gate.wait)  # the values are set before the stream gets there
        size, foff = ugds.Cell(0), ugds.Cell(3)
        w = v.write_async(buf, size, foff, 0, s)
        size.value, foff.value = 1 << 20, 32768
        gate.set()
        s.synchronize()
        self.assertEqual(w.bytes, 1 << 20, w.error())
        mem[:] = bytes(1 << 20)
        r = v.read_async(buf, 196608, 32768 + 65536, 4096, s)
        bad = v.read_async(buf, 4096, 7, 0, s)
        s.synchronize()
        self.assertEqual(r.bytes, 196608, r.error())
        self.assertEqual(bytes(mem[4096 : 4096 + 196608]), want[65536 : 65536 + 196608])
        self.assertEqual(bad.bytes, -errno.EINVAL)
        self.drv.deregister(buf)

    def test_batch_on_a_volume(self):
        v = ugds.Volume(self.hs, stripe=16384)
        want = pattern(9, 1 << 20)
        mem = bytearray(want)
        buf = self.drv.register(mem)
        b = v.batch(8)
        ios = [("write", buf, 131072, i * 131072, i * 131072, i) for i in range(8)]
        b.submit(ios)
        evs = b.get_status(min_nr=8, max_nr=8)
        self.assertEqual(sorted(e[0] for e in evs), list(range(8)))
        self.assertTrue(all(e[1] == "complete" and e[2] == 131072 for e in evs))
        mem[:] = bytes(1 << 20)
        b.submitv([("read", [(buf, 0, 65536), (buf, 524288, 65536)], 0, 42)])
        (cookie, status, n), = b.get_status(min_nr=1)
        self.assertEqual((cookie, status, n), (42, "complete", 131072))
        self.assertEqual(bytes(mem[:65536]), want[:65536])
        self.assertEqual(bytes(mem[524288 : 524288 + 65536]), want[65536:131072])
        s = b.stats()
        self.assertEqual((s["submitted"], s["ended"], s["bytes_written"], s["bytes_read"]), (9, 9, 1 << 20, 131072))
        with self.assertRaises(ugds.InvalidArgument):
            b.submit([("read", buf, 4096, v.capacity, 0, 1)])
        self.assertEqual(b.outstanding, 0)
        del b
        self.drv.deregister(buf)

    def test_concatenated_and_bad_input(self):
        v = ugds.Volume(self.hs[:2], stripe=0)
        self.assertEqual((v.capacity, v.stripe), (8 << 20, 0))
        mem = bytearray(pattern(6, 65536))
        buf = self.drv.register(mem)
        self.assertEqual(v.write(buf, 65536, (4 << 20) - 32768), 65536)
        mem[:] = bytes(65536)
        self.assertEqual(self.hs[1].read(buf, 32768, 0), 32768)
        self.assertEqual(bytes(mem[:32768]), pattern(6, 65536)[32768:])
        with self.assertRaises(ugds.InvalidArgument):
            v.read(buf, 4096, 7)
        with self.assertRaises(ugds.InvalidArgument):
            v.read(buf, 65536, (8 << 20) - 4096)
        with self.assertRaises(ugds.InvalidArgument):
            ugds.Volume(self.hs, stripe=3 * 4096)
        with self.assertRaises(ugds.InvalidArgument):
            ugds.Volume([], stripe=0)
        self.drv.deregister(buf)


class Tcp(unittest.TestCase):
    """NVMe over TCP through ugds's initiator: `Driver.open_tcp`."""

    def test_round_trip_over_tcp_with_and_without_digests(self):
        t = ugds.EmuTcpTarget(size=16 << 20, block_size=4096)
        drv = ugds.Driver()
        for digests in (False, True):
            h = drv.open_tcp(t.addr, t.nqn, digests=digests, interrupt=digests)
            self.assertEqual(h.capacity, 16 << 20)
            self.assertEqual(h.block_size, 4096)
            data = pattern(7 if digests else 8, 65536)
            mem = bytearray(data)
            buf = drv.register(mem)
            self.assertEqual(h.write(buf, 65536, 8192), 65536)
            mem[:] = bytes(65536)
            self.assertEqual(h.read(buf, 65536, 8192), 65536)
            self.assertEqual(bytes(mem), data)
            h.close()
            drv.deregister(buf)

    def test_nobody_listening_is_a_clear_error(self):
        with self.assertRaises(ugds.Error) as cm:
            ugds.Driver().open_tcp("127.0.0.1:1", "nqn.2026-12.io.ugds:absent")
        self.assertIn("127.0.0.1:1", str(cm.exception))


class Rdma(unittest.TestCase):
    """NVMe over RDMA: `Driver.open_rdma` where no RDMA device reaches the
    target (this machine, CI's host); nvmet-rdma runs in the QEMU guest."""

    def test_no_rdma_path_is_a_clear_error(self):
        with self.assertRaises(ugds.Error) as cm:
            ugds.Driver().open_rdma("127.0.0.1:9", "nqn.2026-12.io.ugds:absent")
        self.assertIn("RDMA", str(cm.exception))
        # Interrupt completion is asked for by keyword, as for open_tcp.
        with self.assertRaises(ugds.Error) as cm:
            ugds.Driver().open_rdma("127.0.0.1:9", "nqn.2026-12.io.ugds:absent", interrupt=True)
        self.assertIn("RDMA", str(cm.exception))
        # So is copying instead of registering buffers with the device.
        with self.assertRaises(ugds.Error) as cm:
            ugds.Driver().open_rdma("127.0.0.1:9", "nqn.2026-12.io.ugds:absent", copy=True)
        self.assertIn("RDMA", str(cm.exception))


class KernelPath(unittest.TestCase):
    """A file through the kernel (io_uring): `Driver.open_file`."""

    def setUp(self):
        import tempfile

        fd, self.path = tempfile.mkstemp(prefix="ugds-py-", dir=os.environ.get("TMPDIR", "/tmp"))
        os.write(fd, pattern(3, 10000))
        os.close(fd)
        self.drv = ugds.Driver()

    def tearDown(self):
        os.unlink(self.path)

    def test_read_write_and_the_end_of_the_file(self):
        h = self.drv.open_file(self.path)
        self.assertEqual(h.capacity, 10240)
        mem = bytearray(8192)
        buf = self.drv.register(mem)
        self.assertEqual(h.read(buf, 8192, 0), 8192)
        self.assertEqual(bytes(mem), pattern(3, 10000)[:8192])
        # Into the last, partial block: the bytes there are.
        self.assertEqual(h.read(buf, 2048, 8192), 10000 - 8192)
        self.assertEqual(bytes(mem[: 10000 - 8192]), pattern(3, 10000)[8192:])
        mem[:4096] = b"\x5a" * 4096
        self.assertEqual(h.write(buf, 4096, 4096), 4096)
        h.flush()
        with open(self.path, "rb") as f:
            f.seek(4096)
            self.assertEqual(f.read(4096), b"\x5a" * 4096)
        h.close()
        self.drv.deregister(buf)

    def test_sqpoll_ring(self):
        h = self.drv.open_file(self.path, ring="sqpoll")
        mem = bytearray(8192)
        buf = self.drv.register(mem)
        self.assertEqual(h.read(buf, 8192, 0), 8192)
        self.assertEqual(bytes(mem), pattern(3, 10000)[:8192])
        h.close()
        self.drv.deregister(buf)
        with self.assertRaises(ugds.InvalidArgument):
            self.drv.open_file(self.path, ring="fast")

    def test_bad_input_is_a_typed_error(self):
        h = self.drv.open_file(self.path)
        buf = self.drv.register(bytearray(4096))
        with self.assertRaises(ugds.InvalidArgument):
            h.read(buf, 100, 0)
        with self.assertRaises(ugds.InvalidArgument):
            h.read(buf, 512, 10240)
        with self.assertRaises(ugds.Error):
            self.drv.open_file(self.path + ".missing")
        h.close()
        self.drv.deregister(buf)


class Cuda(unittest.TestCase):
    def setUp(self):
        gpu_or_skip()
        self.drv = ugds.Driver()
        self.h = self.drv.open_emulated(size=64 << 20)

    def tearDown(self):
        self.h.close()

    def test_cuda_tensor_sync_and_batch(self):
        src = torch.arange(1 << 18, dtype=torch.int32)  # 1 MiB on the host
        host = self.drv.register(src)
        self.h.write(host, 1 << 20, 0)
        t = torch.zeros(1 << 18, dtype=torch.int32, device="cuda")
        buf = self.drv.register(t)
        self.assertTrue(buf.is_device)
        self.assertEqual(self.h.read(buf, 1 << 20, 0), 1 << 20)
        self.assertTrue(torch.equal(t.cpu(), src))
        b = self.h.batch(64)
        t.zero_()
        torch.cuda.synchronize()  # I/O is not ordered with GPU work (as with cuFile)
        b.submit([("read", buf, 16384, i * 16384, i * 16384, i) for i in range(64)])
        ev = b.get_status(64, 64, timeout=10)
        self.assertTrue(all(s == "complete" for _, s, _ in ev))
        self.assertTrue(torch.equal(t.cpu(), src))
        # GPU -> namespace -> host.
        t.mul_(3)
        torch.cuda.synchronize()
        self.h.write(buf, 1 << 20, 1 << 20)
        self.h.read(host, 1 << 20, 1 << 20)
        self.assertTrue(torch.equal(src, (torch.arange(1 << 18, dtype=torch.int32) * 3)))
        b.cancel()
        self.drv.deregister(buf)
        self.drv.deregister(host)

    def test_stream_ordered_on_torch_stream(self):
        data = torch.randint(0, 255, (4 << 20,), dtype=torch.uint8)
        host = self.drv.register(data)
        self.h.write(host, 4 << 20, 0)
        t = torch.zeros(4 << 20, dtype=torch.uint8, device="cuda")
        buf = self.drv.register(t)
        torch_stream = torch.cuda.Stream()
        s = ugds.Stream.cuda(torch_stream.cuda_stream)
        self.assertEqual(s.wait_mode, "device")
        with torch.cuda.stream(torch_stream):
            # Kernels before and after the reads, on the same stream. The
            # first read's size is bound when the stream reaches it: a kernel
            # of about 50 ms holds the stream until the host has set it (the
            # fill alone took microseconds, and the stream could reach the
            # read before `size.value` was set: seen once on the H200).
            t.fill_(7)
            torch.cuda._sleep(100_000_000)
            size = ugds.Cell(0)
            rs = [self.h.read_async(buf, size if i == 0 else 1 << 20, i << 20, i << 20, s) for i in range(4)]
            size.value = 1 << 20
            out = t.to(torch.int32).sum()
        torch_stream.synchronize()
        self.assertTrue(all(r.bytes == 1 << 20 for r in rs), [r.error() for r in rs])
        self.assertEqual(int(out), int(data.to(torch.int64).sum()))
        self.assertTrue(torch.equal(t.cpu(), data))
        # Export for other consumers.
        fd, off, n = self.drv.export_dmabuf(buf)
        self.assertEqual((off, n), (0, 4 << 20))
        os.close(fd)
        del s
        self.drv.deregister(buf)
        self.drv.deregister(host)

    def test_sixty_four_torch_streams_at_once(self):
        n, sz = 64, 65536
        data = torch.randint(0, 255, (n * sz,), dtype=torch.uint8)
        host = self.drv.register(data)
        self.h.write(host, n * sz, 0)
        t = torch.zeros(n * sz, dtype=torch.uint8, device="cuda")
        buf = self.drv.register(t)
        streams = [torch.cuda.Stream() for _ in range(n)]
        ours = [ugds.Stream.cuda(ts.cuda_stream) for ts in streams]
        results = []
        for i, (ts, s) in enumerate(zip(streams, ours)):
            part = t[i * sz : (i + 1) * sz]
            with torch.cuda.stream(ts):
                part.fill_(1)  # before: overwritten by the read
                results.append(self.h.read_async(buf, sz, i * sz, i * sz, s))
                part.add_(1)  # after the read: sees its data
                results.append(self.h.write_async(buf, sz, (8 << 20) + i * sz, i * sz, s))
                part.add_(1)
        for ts in streams:
            ts.synchronize()
        self.assertTrue(all(r.bytes == sz for r in results), [r.error() for r in results if r.bytes != sz][:3])
        self.assertTrue(torch.equal(t.cpu(), data + 2))
        written = t.cpu() - 1
        self.h.read(host, n * sz, 8 << 20)
        self.assertTrue(torch.equal(data, written))
        del ours, streams  # the torch streams may go before or after ours
        self.drv.deregister(buf)
        self.drv.deregister(host)

    def test_cuda_tensor_moved_or_collected(self):
        t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        buf = self.drv.register(t)
        t.set_(torch.zeros(1 << 20, dtype=torch.uint8, device="cuda"))
        with self.assertRaises(ugds.InvalidArgument):
            self.h.read(buf, 4096, 0)
        del buf, t
        gc.collect()
        # Collected while a read is queued behind a kernel on its stream.
        t = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
        ptr = t.data_ptr()
        buf = self.drv.register(t)
        ts = torch.cuda.Stream()
        s = ugds.Stream.cuda(ts.cuda_stream)
        with torch.cuda.stream(ts):
            torch.cuda._sleep(500_000_000)
            r = self.h.read_async(buf, 1 << 20, 0, 0, s)
        del buf, t
        gc.collect()
        self.assertEqual(self.drv.pending_releases, 1)
        # The allocator must not hand that memory out again meanwhile.
        other = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
        self.assertNotEqual(other.data_ptr(), ptr)
        ts.synchronize()
        self.assertEqual(r.bytes, 1 << 20, r.error())
        self.assertEqual(self.drv.pending_releases, 0)

    def test_cuda_array_interface(self):
        t = torch.zeros(4096, dtype=torch.uint8, device="cuda")
        ptr, n, kind = ugds.memory_of(t)
        self.assertEqual((n, kind), (4096, "cuda"))

        class Cai:
            __cuda_array_interface__ = {"data": (ptr, False), "shape": (4096,), "typestr": "|u1", "version": 3}

        buf = self.drv.register(Cai())
        self.assertTrue(buf.is_device)
        self.drv.deregister(buf)
        # Past the end of the allocation (torch's caching allocator may
        # place the tensor inside a larger one, so go far past it).
        with self.assertRaises(ugds.GpuError):
            self.drv.register_raw(ptr, 1 << 40, "cuda")


if __name__ == "__main__":
    unittest.main()
