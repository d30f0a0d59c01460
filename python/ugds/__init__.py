"""ugds: user-space GPU Direct Storage for Python.

Moves bytes between an NVMe namespace and GPU (or host) memory through a
user-space NVMe driver, behind a cuFile-style API: synchronous reads and
writes, batches, and stream-ordered I/O on CUDA streams.

    import torch, ugds
    drv = ugds.Driver()
    h = drv.open_emulated()                  # or drv.open_drv("/dev/ugds_drv0")
    t = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
    buf = drv.register(t)
    h.write(buf, 1 << 20, 0)
    h.read(buf, 4096, 0)
    s = ugds.Stream.cuda(torch.cuda.current_stream().cuda_stream)
    r = h.read_async(buf, 4096, 0, 0, s)
    s.synchronize(); assert r.bytes == 4096
    drv.deregister(buf)

Registered memory may be a torch tensor (CPU or CUDA), anything with
``__cuda_array_interface__`` (CuPy, Numba) or ``__array_interface__``
(NumPy), a DLPack producer, or a writable buffer (bytearray). It must be
contiguous. The Buffer keeps it alive and in place: it holds the object
and, for objects with the buffer protocol, a buffer export (so a bytearray
cannot be resized while registered); a torch tensor's storage is checked at
every I/O and I/O is refused if it moved. A Buffer that is collected
deregisters itself, or, while I/O still holds it, keeps the memory alive
until that I/O is done.
"""

import ctypes

from ._ugds import (
    AlreadyRegistered,
    Batch,
    Buffer,
    BusyError,
    Cell,
    ClosedError,
    DeviceError,
    EmuTcpTarget,
    Error,
    GpuError,
    Handle,
    InvalidArgument,
    NotRegistered,
    Server,
    Stream,
    StreamResult,
    TimeoutError,
    UnsupportedError,
    Volume,
    WedgedError,
    __version__,
)
from ._ugds import Driver as _Driver

__all__ = [
    "Driver", "Handle", "Volume", "EmuTcpTarget", "Buffer", "Batch", "Stream", "StreamResult", "Cell", "memory_of",
    "Error", "InvalidArgument", "NotRegistered", "AlreadyRegistered", "BusyError", "TimeoutError",
    "WedgedError", "ClosedError", "UnsupportedError", "GpuError", "DeviceError", "__version__",
]

# DLPack's device types.
_DL_CPU, _DL_CUDA, _DL_CUDA_HOST, _DL_ROCM, _DL_ROCM_HOST, _DL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides)):
        if dim != 1 and stride != expect:
            return False
        expect *= dim
    return True


def _prod(xs):
    n = 1
    for x in xs:
        n *= x
    return n


def _from_dlpack(obj):
    capsule = obj.__dlpack__()
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype = ctypes.c_void_p
    get.argtypes = [ctypes.py_object, ctypes.c_char_p]
    t = _DLTensor.from_address(get(capsule, b"dltensor"))
    shape = [t.shape[i] for i in range(t.ndim)]
    itemsize = (t.dtype.bits * t.dtype.lanes + 7) // 8
    strides = None if not t.strides else [t.strides[i] * itemsize for i in range(t.ndim)]
    if not _contiguous(shape, strides, itemsize):
        raise InvalidArgument("a DLPack tensor must be contiguous to be registered")
    kind = {_DL_CPU: "host", _DL_CUDA_HOST: "host", _DL_ROCM_HOST: "host", _DL_CUDA: "cuda", _DL_ROCM: "hip"}.get(
        t.device.device_type
    )
    if kind is None:
        raise InvalidArgument(f"DLPack device type {t.device.device_type} cannot be registered")
    return (t.data or 0) + t.byte_offset, _prod(shape) * itemsize, kind


def memory_of(obj):
    """The ``(address, nbytes, kind)`` of a tensor-like object; kind is
    "host", "cuda" or "hip". Raises InvalidArgument for what cannot be
    registered (non-contiguous, read-only, unknown)."""
    # torch.Tensor
    if hasattr(obj, "data_ptr") and hasattr(obj, "element_size") and hasattr(obj, "is_contiguous"):
        if not obj.is_contiguous():
            raise InvalidArgument("a tensor must be contiguous to be registered")
        kind = "host"
        if getattr(obj, "is_cuda", False):
            import torch  # noqa: PLC0415

            kind = "hip" if torch.version.hip else "cuda"
        return obj.data_ptr(), obj.numel() * obj.element_size(), kind
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        ptr, readonly = cai["data"]
        if readonly:
            raise InvalidArgument("read-only memory cannot be registered")
        itemsize = int(cai["typestr"][2:])
        if not _contiguous(cai["shape"], cai.get("strides"), itemsize):
            raise InvalidArgument("an array must be contiguous to be registered")
        return ptr, _prod(cai["shape"]) * itemsize, "cuda"
    ai = getattr(obj, "__array_interface__", None)
    if ai is not None:
        ptr, readonly = ai["data"]
        if readonly:
            raise InvalidArgument("read-only memory cannot be registered")
        itemsize = int(ai["typestr"][2:])
        if not _contiguous(ai["shape"], ai.get("strides"), itemsize):
            raise InvalidArgument("an array must be contiguous to be registered")
        return ptr, _prod(ai["shape"]) * itemsize, "host"
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj)
    try:
        view = memoryview(obj)
    except TypeError:
        raise InvalidArgument(f"cannot register a {type(obj).__name__}: not a tensor, array or buffer") from None
    if view.readonly or not view.c_contiguous:
        raise InvalidArgument("a buffer must be writable and contiguous to be registered")
    c = (ctypes.c_char * view.nbytes).from_buffer(view)
    return ctypes.addressof(c), view.nbytes, "host"


def _export(obj):
    """A buffer export of ``obj`` (PEP 3118), held while it is registered
    so that its memory cannot be resized or moved; None if it has none."""
    try:
        return memoryview(obj)
    except TypeError:
        return None


def _is_torch_tensor(obj):
    t = type(obj)
    return t.__module__.startswith("torch") and hasattr(obj, "untyped_storage") and hasattr(obj, "data_ptr")


class Driver(_Driver):
    """Library state: open handles, registered buffers."""

    def alloc_host(self, nbytes):
        """``nbytes`` of zeroed, page-aligned host memory as a writable
        memoryview of bytes (register it as any buffer). In a process
        attached to a served controller (``open_attached``) this is the
        host memory that can be registered. Freed when the view and every
        registration of it are gone."""
        mem = self.host_memory(nbytes)
        arr = (ctypes.c_ubyte * nbytes).from_address(mem.ptr)
        arr._ugds_memory = mem  # freed with the array, which the view holds
        return memoryview(arr).cast("B")

    def register(self, obj, nbytes=None):
        """Registers a tensor-like object for I/O (see the module docs) and
        returns its Buffer. ``nbytes`` registers only its first bytes."""
        ptr, size, kind = memory_of(obj)
        if nbytes is not None:
            if nbytes > size:
                raise InvalidArgument(f"nbytes {nbytes} is more than the object's {size} bytes")
            size = nbytes
        tensor = None
        if _is_torch_tensor(obj):
            tensor = obj
            # The storage object keeps the allocation alive even if the
            # tensor is later pointed elsewhere (set_).
            owner = (obj, obj.untyped_storage())
        else:
            owner = (obj, _export(obj))
        return self.register_raw(ptr, size, kind, owner, tensor)
