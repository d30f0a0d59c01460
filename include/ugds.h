/*
 * ugds.h: the C interface of libugds, user-space GPU Direct Storage.
 *
 * A drop-in for the existing uGDS C interface (which mirrors NVIDIA cuFile;
 * error numbers are cuFile's CU_FILE_*): same names, values and layouts.
 *
 *   uGDSDriverOpen();
 *   int fd = open("/dev/ugds_drv0", O_RDWR);      (or any regular file with
 *   uGDSDescr_t d = { .type = UGDS_HANDLE_TYPE_OPAQUE_FD, .handle.fd = fd };
 *   uGDSHandle_t fh; uGDSHandleRegister(&fh, &d);  UGDS_EMULATE=1: an emulated
 *   uGDSBufRegister(gpu_buf, len, 0);              controller over that file)
 *   ssize_t n = uGDSRead(fh, gpu_buf, 4096, 0, 0);
 *
 * Environment: UGDS_INTERRUPT_MODE=1 selects MSI-X completion for handles
 * registered afterwards; UGDS_EMULATE=1 lets a handle be registered on a
 * regular file, served by an emulated NVMe controller whose namespace is
 * that file (UGDS_EMULATE_BLOCK_SIZE: 512 or 4096, default 512; another
 * value of either refuses the registration with UGDS_INVALID_VALUE).
 * UGDS_MODE=latency|throughput|priority|adaptive serves each synchronous
 * request of handles registered afterwards as that mode says (an unknown
 * name refuses the registration with UGDS_INVALID_VALUE); UGDS_TRACE=N
 * traces each queue's last N commands; UGDS_SHADOW_DOORBELLS=1|0 asks for
 * shadow doorbells or not (default: only under a hypervisor where doorbell
 * writes trap, such as KVM). UGDS_SYNC_QUEUES=N gives each handle N queue
 * pairs for synchronous calls (default one per CPU, 4 to 32, at most what
 * the controller grants; threads beyond N share them), UGDS_BATCH_QUEUES=N N batch queue
 * pairs (a value that is not a number, of these or of UGDS_TRACE, or of
 * UGDS_SHADOW_DOORBELLS other than 0 or 1, refuses the registration).
 *
 * Apache-2.0 OR MIT.
 */
#ifndef UGDS_H
#define UGDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define UGDSOP_BASE_ERR 5000

typedef enum uGDSOpError {
    UGDS_SUCCESS = 0,
    UGDS_DRIVER_NOT_INITIALIZED = UGDSOP_BASE_ERR + 1,
    UGDS_DRIVER_INVALID_PROPS = UGDSOP_BASE_ERR + 2,
    UGDS_DRIVER_UNSUPPORTED_LIMIT = UGDSOP_BASE_ERR + 3,
    UGDS_DRIVER_VERSION_MISMATCH = UGDSOP_BASE_ERR + 4,
    UGDS_DRIVER_VERSION_READ_ERROR = UGDSOP_BASE_ERR + 5,
    UGDS_DRIVER_CLOSING = UGDSOP_BASE_ERR + 6,
    UGDS_PLATFORM_NOT_SUPPORTED = UGDSOP_BASE_ERR + 7,
    UGDS_IO_NOT_SUPPORTED = UGDSOP_BASE_ERR + 8,
    UGDS_DEVICE_NOT_SUPPORTED = UGDSOP_BASE_ERR + 9,
    UGDS_NVFS_DRIVER_ERROR = UGDSOP_BASE_ERR + 10,
    UGDS_CUDA_DRIVER_ERROR = UGDSOP_BASE_ERR + 11,
    UGDS_CUDA_POINTER_INVALID = UGDSOP_BASE_ERR + 12,
    UGDS_CUDA_MEMORY_TYPE_INVALID = UGDSOP_BASE_ERR + 13,
    UGDS_CUDA_POINTER_RANGE_ERROR = UGDSOP_BASE_ERR + 14,
    UGDS_CUDA_CONTEXT_MISMATCH = UGDSOP_BASE_ERR + 15,
    UGDS_INVALID_MAPPING_SIZE = UGDSOP_BASE_ERR + 16,
    UGDS_INVALID_MAPPING_RANGE = UGDSOP_BASE_ERR + 17,
    UGDS_INVALID_FILE_TYPE = UGDSOP_BASE_ERR + 18,
    UGDS_INVALID_FILE_OPEN_FLAG = UGDSOP_BASE_ERR + 19,
    UGDS_DIO_NOT_SET = UGDSOP_BASE_ERR + 20,
    UGDS_INVALID_VALUE = UGDSOP_BASE_ERR + 22,
    UGDS_MEMORY_ALREADY_REGISTERED = UGDSOP_BASE_ERR + 23,
    UGDS_MEMORY_NOT_REGISTERED = UGDSOP_BASE_ERR + 24,
    UGDS_PERMISSION_DENIED = UGDSOP_BASE_ERR + 25,
    UGDS_DRIVER_ALREADY_OPEN = UGDSOP_BASE_ERR + 26,
    UGDS_HANDLE_NOT_REGISTERED = UGDSOP_BASE_ERR + 27,
    UGDS_HANDLE_ALREADY_REGISTERED = UGDSOP_BASE_ERR + 28,
    UGDS_DEVICE_NOT_FOUND = UGDSOP_BASE_ERR + 29,
    UGDS_INTERNAL_ERROR = UGDSOP_BASE_ERR + 30,
    UGDS_GETNEWFD_FAILED = UGDSOP_BASE_ERR + 31,
    UGDS_NVFS_SETUP_ERROR = UGDSOP_BASE_ERR + 33,
    UGDS_IO_DISABLED = UGDSOP_BASE_ERR + 34,
    UGDS_GPU_MEMORY_PINNING_FAILED = UGDSOP_BASE_ERR + 36,
    UGDS_BATCH_CAPACITY_EXCEEDED = UGDSOP_BASE_ERR + 40,
    UGDS_RDMA_MR_STILL_ACTIVE = UGDSOP_BASE_ERR + 41,
    UGDS_BUSY = UGDSOP_BASE_ERR + 42,
    UGDS_OUT_OF_MEMORY = UGDSOP_BASE_ERR + 43
} uGDSOpError;

/* A result: err, and the CUDA (or HIP) driver's code when err is a GPU error. */
typedef struct uGDSError {
    uGDSOpError err;
    int cu_err;
} uGDSError_t;

typedef enum uGDSHandleType {
    UGDS_HANDLE_TYPE_OPAQUE_FD = 1,
    UGDS_HANDLE_TYPE_OPAQUE_WIN32 = 2,
    UGDS_HANDLE_TYPE_USERSPACE_FS = 3
} uGDSHandleType;

typedef struct uGDSDescr {
    enum uGDSHandleType type;
    union {
        int fd;
        void *handle;
    } handle;
} uGDSDescr_t;

/* Points to an object whose first member is the registered fd (an int). */
typedef void *uGDSHandle_t;

typedef enum uGDSBackend {
    UGDS_BACKEND_DEFAULT = 0,
    UGDS_BACKEND_CUDA = 1,
    UGDS_BACKEND_HIP = 2
} uGDSBackend_t;

typedef struct uGDSBufConfig {
    uGDSBackend_t backend;
    bool enable_export;
} uGDSBufConfig_t;

/* fd is a new descriptor: the caller closes it. */
typedef struct uGDSDmabufExport {
    int fd;
    uint64_t offset;
    size_t length;
} uGDSDmabufExport_t;

typedef struct uGDSRDMARegion {
    void *mr;
    uint64_t iova;
    uint32_t lkey;
    uint32_t rkey;
    uint64_t token;
} uGDSRDMARegion_t;

typedef void *uGDSBatchHandle_t;

typedef enum uGDSOpcode {
    UGDS_READ = 0,
    UGDS_WRITE = 1
} uGDSOpcode_t;

typedef enum uGDSBatchStatus {
    UGDS_BATCH_WAITING = 0x01,
    UGDS_BATCH_PENDING = 0x02,
    UGDS_BATCH_INVALID = 0x04,
    UGDS_BATCH_CANCELED = 0x08,
    UGDS_BATCH_COMPLETE = 0x10,
    UGDS_BATCH_TIMEOUT = 0x20,
    UGDS_BATCH_FAILED = 0x40
} uGDSBatchStatus_t;

typedef struct uGDSIOParams {
    void *devPtr_base;
    off_t file_offset;
    off_t devPtr_offset;
    size_t size;
    uGDSOpcode_t opcode;
    void *cookie;
} uGDSIOParams_t;

typedef struct uGDSIOEvents {
    void *cookie;
    uGDSBatchStatus_t status;
    ssize_t ret;
} uGDSIOEvents_t;

/* The largest nr of uGDSBatchIOSetUp (an extension; the existing uGDS has
 * no stated limit). */
#define UGDS_MAX_BATCH_IO 65536

/* Flags of uGDSBufRegister. */
#define NVM_MAP_DMABUF 0x1
#define UGDS_REGISTER_DMABUF NVM_MAP_DMABUF
#define NVM_MAP_RDMA 0x2
#define NVM_MAP_FORCE_CUDA 0x4

static inline const char *uGDS_status_error(uGDSOpError status) {
    switch (status) {
    case UGDS_SUCCESS: return "success";
    case UGDS_DRIVER_NOT_INITIALIZED: return "driver not initialized";
    case UGDS_DRIVER_INVALID_PROPS: return "invalid driver properties";
    case UGDS_DRIVER_UNSUPPORTED_LIMIT: return "driver limit not supported";
    case UGDS_DRIVER_VERSION_MISMATCH: return "driver version mismatch";
    case UGDS_DRIVER_VERSION_READ_ERROR: return "driver version read error";
    case UGDS_DRIVER_CLOSING: return "driver is closing";
    case UGDS_PLATFORM_NOT_SUPPORTED: return "platform not supported";
    case UGDS_IO_NOT_SUPPORTED: return "I/O not supported";
    case UGDS_DEVICE_NOT_SUPPORTED: return "device not supported";
    case UGDS_NVFS_DRIVER_ERROR: return "kernel helper error";
    case UGDS_CUDA_DRIVER_ERROR: return "GPU driver error";
    case UGDS_CUDA_POINTER_INVALID: return "invalid GPU pointer";
    case UGDS_CUDA_MEMORY_TYPE_INVALID: return "GPU memory type cannot be used";
    case UGDS_CUDA_POINTER_RANGE_ERROR: return "range runs past the GPU allocation";
    case UGDS_CUDA_CONTEXT_MISMATCH: return "GPU context mismatch";
    case UGDS_INVALID_MAPPING_SIZE: return "invalid mapping size";
    case UGDS_INVALID_MAPPING_RANGE: return "invalid mapping range";
    case UGDS_INVALID_FILE_TYPE: return "invalid file type";
    case UGDS_INVALID_FILE_OPEN_FLAG: return "invalid file open flags";
    case UGDS_DIO_NOT_SET: return "O_DIRECT not set";
    case UGDS_INVALID_VALUE: return "invalid value";
    case UGDS_MEMORY_ALREADY_REGISTERED: return "memory already registered";
    case UGDS_MEMORY_NOT_REGISTERED: return "memory not registered";
    case UGDS_PERMISSION_DENIED: return "permission denied";
    case UGDS_DRIVER_ALREADY_OPEN: return "driver already open";
    case UGDS_HANDLE_NOT_REGISTERED: return "handle not registered";
    case UGDS_HANDLE_ALREADY_REGISTERED: return "handle already registered";
    case UGDS_DEVICE_NOT_FOUND: return "device not found";
    case UGDS_INTERNAL_ERROR: return "internal error";
    case UGDS_GETNEWFD_FAILED: return "failed to get a new descriptor";
    case UGDS_NVFS_SETUP_ERROR: return "kernel helper setup error";
    case UGDS_IO_DISABLED: return "I/O disabled";
    case UGDS_GPU_MEMORY_PINNING_FAILED: return "GPU memory pinning failed";
    case UGDS_BATCH_CAPACITY_EXCEEDED: return "batch capacity exceeded";
    case UGDS_RDMA_MR_STILL_ACTIVE: return "RDMA memory region still active";
    case UGDS_BUSY: return "busy: I/O in flight";
    case UGDS_OUT_OF_MEMORY: return "out of memory";
    }
    return "unknown error";
}

#define IS_UGDS_ERR(err) (abs((int)(err)) > UGDSOP_BASE_ERR)
#define UGDS_ERRSTR(err) uGDS_status_error((uGDSOpError)abs((int)(err)))

/* Library state only; device work happens at handle registration. */
uGDSError_t uGDSDriverOpen(void);
/* Closes every handle (waiting for its I/O). A handle that cannot be closed
 * (wedged: a command timed out) is named in the error (UGDS_IO_DISABLED)
 * and in ugds_last_error(), with what stays pinned. */
uGDSError_t uGDSDriverClose(void);

/* descr->type UGDS_HANDLE_TYPE_OPAQUE_FD with the fd of /dev/ugds_drvN (or of
 * a regular file with UGDS_EMULATE=1). */
uGDSError_t uGDSHandleRegister(uGDSHandle_t *fh, uGDSDescr_t *descr);
uGDSError_t uGDSGetDeviceCapacity(uGDSHandle_t fh, uint64_t *bytes);

/* What each I/O queue pair of a handle has done since it opened (an
 * extension): commands submitted and completed (a request of several
 * commands counts each), bytes, errors, timeouts, doorbell writes and
 * interrupts. Counting costs the I/O path no shared atomic operation. */
typedef struct ugds_queue_stats {
    uint16_t qid;
    uint16_t role; /* UGDS_QUEUE_SYNC, UGDS_QUEUE_BATCH, UGDS_QUEUE_LENDABLE */
    uint32_t reserved;
    uint64_t submitted;
    uint64_t completed;
    uint64_t in_flight;
    uint64_t bytes_read;
    uint64_t bytes_written;
    uint64_t errors;          /* commands completed with an error status */
    uint64_t timeouts;        /* commands escalated by the handle's timeout */
    uint64_t doorbell_writes; /* submission-tail and completion-head writes */
    uint64_t interrupts;      /* interrupt waits the queue's vector woke */
} ugds_queue_stats_t;
#define UGDS_QUEUE_SYNC 0
#define UGDS_QUEUE_BATCH 1
#define UGDS_QUEUE_LENDABLE 2
/* Fills up to max entries of out and sets *n to the handle's number of I/O
 * queues (out may be NULL with max 0, to ask for the count). */
uGDSError_t uGDSGetQueueStats(uGDSHandle_t fh, ugds_queue_stats_t *out, size_t max, size_t *n);
/* What the requests of a batch context, or the stream-ordered requests
 * placed on a stream (on every handle), have done (extensions):
 * uGDSBatchIOGetStats and uGDSStreamGetStats. A stream request counts as
 * submitted when the stream reaches it, as ended when its result is
 * written; canceled is a batch context's alone. uGDSStreamGetStats needs a
 * stream the library knows (registered, or used for stream-ordered I/O). */
typedef struct ugds_request_stats {
    uint64_t submitted;
    uint64_t ended;
    uint64_t in_flight;
    uint64_t bytes_read;    /* by the requests that succeeded */
    uint64_t bytes_written; /* by the requests that succeeded */
    uint64_t errors;
    uint64_t canceled;
    uint64_t timeouts;
} ugds_request_stats_t;
void uGDSHandleDeregister(uGDSHandle_t fh);
/* timeout_sec 0: UGDS_BUSY if I/O is in flight; > 0: wait that long; -1:
 * wait; < -1: after-reset teardown of a wedged handle. */
uGDSError_t uGDSHandleDeregisterEx(uGDSHandle_t fh, int timeout_sec);

uGDSError_t uGDSBufRegister(const void *base, size_t len, int flags);
uGDSError_t uGDSBufRegisterEx(const void *base, size_t len, const uGDSBufConfig_t *config);
uGDSError_t uGDSBufDeregister(const void *base);
/* ugds extension: `size` bytes of zeroed, page-aligned host memory for I/O.
 * In a process attached to a controller `ugds serve` owns (UGDS_ATTACH) it
 * is shared memory, the only host memory such a process can register (the
 * owner maps the same pages for the device); elsewhere plain memory.
 * Free with uGDSHostFree once deregistered. */
uGDSError_t uGDSHostAlloc(void **ptr, size_t size);
uGDSError_t uGDSHostFree(void *ptr);
/* Only a buffer registered with uGDSBufRegisterEx(.., enable_export = true);
 * others get UGDS_IO_NOT_SUPPORTED. The caller closes out->fd. */
uGDSError_t uGDSExportDmabuf(const void *base, uGDSDmabufExport_t *out);
uGDSError_t uGDSRDMARegister(const void *base, void *ibv_pd, int access, uGDSRDMARegion_t *region);
uGDSError_t uGDSRDMAUnregister(const void *base, uGDSRDMARegion_t *region);

/* Bytes moved, or a negative error (-errno, or -uGDSOpError). */
ssize_t uGDSRead(uGDSHandle_t fh, void *base, size_t size, off_t file_offset, off_t buf_offset);
ssize_t uGDSWrite(uGDSHandle_t fh, const void *base, size_t size, off_t file_offset, off_t buf_offset);

/* Vectored I/O (an extension): size bytes at buf_offset into the buffer
 * registered at base, for each segment. */
typedef struct ugds_segment {
    void *base;
    off_t buf_offset;
    size_t size;
} ugds_segment_t;
#define UGDS_MAX_SEGMENTS 256
/* The sum of the segments' sizes at file_offset, to or from the segments in
 * order, as one request. Each segment lies in a registered buffer (host or
 * GPU; uGDSBufRegister) and is a non-zero multiple of the block size; a
 * read's segments may not overlap; count is 1 to UGDS_MAX_SEGMENTS. Bytes
 * moved, or a negative error (-EINVAL for a bad list, with nothing
 * submitted; ugds_last_error() says which segment). */
ssize_t uGDSReadv(uGDSHandle_t fh, const ugds_segment_t *segs, int count, off_t file_offset);
ssize_t uGDSWritev(uGDSHandle_t fh, const ugds_segment_t *segs, int count, off_t file_offset);

/* Volumes (an extension): one handle over count registered handles (1 to
 * UGDS_MAX_VOLUME_MEMBERS, one block size), striped with stripe_bytes
 * stripes (RAID 0: a power of two of at least 4096) or, with stripe_bytes
 * 0, concatenated in order. A volume's handle takes uGDSRead, uGDSWrite,
 * uGDSReadv, uGDSWritev, uGDSReadAsync, uGDSWriteAsync (stream order: the
 * volume's stream thread runs the request when the stream reaches it),
 * uGDSGetDeviceCapacity, the uGDSBatchIO* calls
 * (nr up to UGDS_MAX_BATCH_IO / 4) and uGDSHandleDeregister (other calls
 * refuse it with UGDS_IO_NOT_SUPPORTED); a request spanning members runs
 * on them at once and completes whole or fails whole, and
 * ugds_last_error() names the member that failed. Members stay usable on
 * their own; deregistering one is refused (UGDS_BUSY) while a volume holds
 * it. */
#define UGDS_MAX_VOLUME_MEMBERS 64
uGDSError_t uGDSVolumeOpen(uGDSHandle_t *vh, const uGDSHandle_t *members, int count, uint64_t stripe_bytes);

/* NVMe over TCP (an extension): a handle on namespace nsid (0: the first)
 * of the controller exporting subnqn at addr ("host:port", 4420 by
 * convention), through ugds's own initiator in user space; flags
 * UGDS_TCP_DIGESTS asks for header and data digests. The handle takes
 * every call a controller's handle takes; it has no file descriptor (its
 * object's fd is -1). Options come from the environment as for
 * uGDSHandleRegister (UGDS_INTERRUPT_MODE=1 sleeps on the sockets). */
#define UGDS_TCP_DIGESTS 1u
uGDSError_t uGDSTcpOpen(uGDSHandle_t *fh, const char *addr, const char *subnqn, uint32_t nsid, uint32_t flags);

/* NVMe over RDMA (an extension): as uGDSTcpOpen, for the controller
 * exporting subnqn at addr ("address:port" on an RDMA device's network),
 * through ugds's own initiator (rdma-core loaded at run time). Registered
 * host buffers are registered with the RDMA device as well and the target
 * moves their data; flags UGDS_RDMA_COPY registers none and copies every
 * command's data through the queues' own memory. GPU memory is registered
 * from its dma-buf where the RDMA device can (soft RoCE cannot: refused
 * while the handle is open). Options come from the environment as for
 * uGDSTcpOpen (UGDS_INTERRUPT_MODE=1 sleeps on the queues' completion
 * channels). */
#define UGDS_RDMA_COPY 1u
uGDSError_t uGDSRdmaOpen(uGDSHandle_t *fh, const char *addr, const char *subnqn, uint32_t nsid, uint32_t flags);

/* A vectored request of a batch (an extension): the range at file_offset to
 * or from segs[0..count] in order (as uGDSReadv), opcode UGDS_READ or
 * UGDS_WRITE; cookie comes back in its one event. */
typedef struct ugds_iov_params {
    const ugds_segment_t *segs;
    int count;
    int opcode;
    off_t file_offset;
    void *cookie;
} ugds_iov_params_t;

/* nr: 1 to UGDS_MAX_BATCH_IO. A handle's batches are destroyed with it. */
uGDSError_t uGDSBatchIOSetUp(uGDSBatchHandle_t *batch, uGDSHandle_t fh, unsigned nr);
uGDSError_t uGDSBatchIOSubmit(uGDSBatchHandle_t batch, unsigned nr, uGDSIOParams_t *params, unsigned flags);
/* nr vectored requests; a bad one (UGDS_INVALID_VALUE) refuses them all. */
uGDSError_t uGDSBatchIOSubmitv(uGDSBatchHandle_t batch, unsigned nr, const ugds_iov_params_t *params, unsigned flags);
/* *nr in: the room in events, 0 meaning the batch's capacity (more than the
 * capacity is read as the capacity); out: the events written. */
uGDSError_t uGDSBatchIOGetStatus(uGDSBatchHandle_t batch, unsigned min_nr, unsigned *nr, uGDSIOEvents_t *events,
                                 struct timespec *timeout);
/* Not in the existing uGDS (cuFile has cuFileBatchIOCancel). */
uGDSError_t uGDSBatchIOCancel(uGDSBatchHandle_t batch);
uGDSError_t uGDSBatchIOGetStats(uGDSBatchHandle_t batch, ugds_request_stats_t *out);
void uGDSBatchIODestroy(uGDSBatchHandle_t batch);

/* stream: a cudaStream_t (or hipStream_t for a stream registered with
 * UGDS_BACKEND_HIP). The pointed-to values are read when the stream reaches
 * the operation; *bytes_p is written before later work on the stream runs. */
uGDSError_t uGDSReadAsync(uGDSHandle_t fh, void *base, size_t *size_p, off_t *file_offset_p, off_t *buf_offset_p,
                          ssize_t *bytes_p, void *stream);
uGDSError_t uGDSWriteAsync(uGDSHandle_t fh, void *base, size_t *size_p, off_t *file_offset_p, off_t *buf_offset_p,
                           ssize_t *bytes_p, void *stream);
/* Vectored, in stream order (an extension): the range at *file_offset_p
 * (read when the stream reaches the operation) to or from segs[0..count] in
 * order, as one request; the bytes moved, or a negative errno, are written
 * to *bytes_p before later work on the stream runs. The list is read and
 * checked at the call (as uGDSReadv checks it: UGDS_INVALID_VALUE for a bad
 * one, nothing enqueued) and may be freed after it. Where the controller
 * reaches GPU memory only through the stream's copies (UGDS_EMULATE, the
 * kernel path), each segment is staged and moved as a request of its own;
 * *bytes_p is then their sum, or the first error. */
uGDSError_t uGDSReadvAsync(uGDSHandle_t fh, const ugds_segment_t *segs, int count, off_t *file_offset_p,
                           ssize_t *bytes_p, void *stream);
uGDSError_t uGDSWritevAsync(uGDSHandle_t fh, const ugds_segment_t *segs, int count, off_t *file_offset_p,
                            ssize_t *bytes_p, void *stream);
/* Streams stay the caller's: registering is optional, and a stream may be
 * destroyed once its operations are enqueued; the library never touches a
 * stream except to enqueue on it (deregistering does not wait for it). */
uGDSError_t uGDSStreamRegister(void *stream);
uGDSError_t uGDSStreamRegisterEx(void *stream, uGDSBackend_t backend);
uGDSError_t uGDSStreamDeregister(void *stream);
uGDSError_t uGDSStreamGetStats(void *stream, ugds_request_stats_t *out);
/* How the library serves a stream's operations enqueued from now on (an
 * extension): priority UGDS_PRIORITY_CRITICAL (sent to the device before
 * other streams' waiting operations), _NORMAL or _BACKGROUND (held back
 * while another stream's operation is on the device); mode a built-in
 * mode's name (see UGDS_MODE; "throughput" lets the library nap, its CPU
 * free, while only such operations are in flight) or NULL.
 * UGDS_INVALID_VALUE for an unknown priority or mode. */
#define UGDS_PRIORITY_CRITICAL 0
#define UGDS_PRIORITY_NORMAL 1
#define UGDS_PRIORITY_BACKGROUND 2
uGDSError_t uGDSStreamSetService(void *stream, int priority, const char *mode);

/* The calling thread's last error message (an extension; never NULL). */
const char *ugds_last_error(void);

/* ABI self-check (used by the tests): the Rust side's view of the layouts
 * and constants; -1 for a name it does not know. */
long ugds_abi_sizeof(const char *type_name);
long ugds_abi_offsetof(const char *type_name, const char *field);
long ugds_abi_constant(const char *name);

#ifdef __cplusplus
}
#endif

#endif /* UGDS_H */
