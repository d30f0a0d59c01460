/* Checks include/ugds.h against the library: the size and layout of every
 * struct and the value of every constant, as the Rust side defines them. */
#include <stddef.h>

#include "common.h"

#define SIZE(T)                                                                                 \
    do {                                                                                        \
        long lib = ugds_abi_sizeof(#T);                                                         \
        if (lib != (long)sizeof(T)) {                                                           \
            fprintf(stderr, "sizeof(%s): header %zu, library %ld\n", #T, sizeof(T), lib);       \
            failures++;                                                                         \
        }                                                                                       \
    } while (0)

#define FIELD(T, F)                                                                                 \
    do {                                                                                            \
        long lib = ugds_abi_offsetof(#T, #F);                                                       \
        if (lib != (long)offsetof(T, F)) {                                                          \
            fprintf(stderr, "offsetof(%s, %s): header %zu, library %ld\n", #T, #F, offsetof(T, F), lib); \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

#define CONST(N)                                                                           \
    do {                                                                                   \
        long lib = ugds_abi_constant(#N);                                                  \
        if (lib != (long)(N)) {                                                            \
            fprintf(stderr, "%s: header %ld, library %ld\n", #N, (long)(N), lib);          \
            failures++;                                                                    \
        }                                                                                  \
    } while (0)

int main(void) {
    SIZE(uGDSOpError);
    SIZE(uGDSHandleType);
    SIZE(uGDSBackend_t);
    SIZE(uGDSOpcode_t);
    SIZE(uGDSBatchStatus_t);
    SIZE(uGDSHandle_t);
    SIZE(uGDSBatchHandle_t);
    SIZE(uGDSError_t);
    FIELD(uGDSError_t, err);
    FIELD(uGDSError_t, cu_err);
    SIZE(uGDSDescr_t);
    FIELD(uGDSDescr_t, type);
    FIELD(uGDSDescr_t, handle);
    SIZE(uGDSBufConfig_t);
    FIELD(uGDSBufConfig_t, backend);
    FIELD(uGDSBufConfig_t, enable_export);
    SIZE(uGDSDmabufExport_t);
    FIELD(uGDSDmabufExport_t, fd);
    FIELD(uGDSDmabufExport_t, offset);
    FIELD(uGDSDmabufExport_t, length);
    SIZE(uGDSRDMARegion_t);
    FIELD(uGDSRDMARegion_t, mr);
    FIELD(uGDSRDMARegion_t, iova);
    FIELD(uGDSRDMARegion_t, lkey);
    FIELD(uGDSRDMARegion_t, rkey);
    FIELD(uGDSRDMARegion_t, token);
    SIZE(uGDSIOParams_t);
    FIELD(uGDSIOParams_t, devPtr_base);
    FIELD(uGDSIOParams_t, file_offset);
    FIELD(uGDSIOParams_t, devPtr_offset);
    FIELD(uGDSIOParams_t, size);
    FIELD(uGDSIOParams_t, opcode);
    FIELD(uGDSIOParams_t, cookie);
    SIZE(uGDSIOEvents_t);
    FIELD(uGDSIOEvents_t, cookie);
    FIELD(uGDSIOEvents_t, status);
    FIELD(uGDSIOEvents_t, ret);
    SIZE(ugds_queue_stats_t);
    FIELD(ugds_queue_stats_t, qid);
    FIELD(ugds_queue_stats_t, role);
    FIELD(ugds_queue_stats_t, submitted);
    FIELD(ugds_queue_stats_t, completed);
    FIELD(ugds_queue_stats_t, in_flight);
    FIELD(ugds_queue_stats_t, bytes_read);
    FIELD(ugds_queue_stats_t, bytes_written);
    FIELD(ugds_queue_stats_t, errors);
    FIELD(ugds_queue_stats_t, timeouts);
    FIELD(ugds_queue_stats_t, doorbell_writes);
    FIELD(ugds_queue_stats_t, interrupts);
    SIZE(ugds_segment_t);
    FIELD(ugds_segment_t, base);
    FIELD(ugds_segment_t, buf_offset);
    FIELD(ugds_segment_t, size);
    SIZE(ugds_iov_params_t);
    FIELD(ugds_iov_params_t, segs);
    FIELD(ugds_iov_params_t, count);
    FIELD(ugds_iov_params_t, opcode);
    FIELD(ugds_iov_params_t, file_offset);
    FIELD(ugds_iov_params_t, cookie);
    SIZE(ugds_request_stats_t);
    FIELD(ugds_request_stats_t, submitted);
    FIELD(ugds_request_stats_t, ended);
    FIELD(ugds_request_stats_t, in_flight);
    FIELD(ugds_request_stats_t, bytes_read);
    FIELD(ugds_request_stats_t, bytes_written);
    FIELD(ugds_request_stats_t, errors);
    FIELD(ugds_request_stats_t, canceled);
    FIELD(ugds_request_stats_t, timeouts);

    CONST(UGDSOP_BASE_ERR);
    CONST(UGDS_SUCCESS);
    CONST(UGDS_QUEUE_SYNC);
    CONST(UGDS_MAX_SEGMENTS);
    CONST(UGDS_MAX_VOLUME_MEMBERS);
    CONST(UGDS_PRIORITY_CRITICAL);
    CONST(UGDS_PRIORITY_NORMAL);
    CONST(UGDS_PRIORITY_BACKGROUND);
    CONST(UGDS_QUEUE_BATCH);
    CONST(UGDS_QUEUE_LENDABLE);
    CONST(UGDS_DRIVER_NOT_INITIALIZED);
    CONST(UGDS_DRIVER_INVALID_PROPS);
    CONST(UGDS_DRIVER_UNSUPPORTED_LIMIT);
    CONST(UGDS_DRIVER_VERSION_MISMATCH);
    CONST(UGDS_DRIVER_VERSION_READ_ERROR);
    CONST(UGDS_DRIVER_CLOSING);
    CONST(UGDS_PLATFORM_NOT_SUPPORTED);
    CONST(UGDS_IO_NOT_SUPPORTED);
    CONST(UGDS_DEVICE_NOT_SUPPORTED);
    CONST(UGDS_NVFS_DRIVER_ERROR);
    CONST(UGDS_CUDA_DRIVER_ERROR);
    CONST(UGDS_CUDA_POINTER_INVALID);
    CONST(UGDS_CUDA_MEMORY_TYPE_INVALID);
    CONST(UGDS_CUDA_POINTER_RANGE_ERROR);
    CONST(UGDS_CUDA_CONTEXT_MISMATCH);
    CONST(UGDS_INVALID_MAPPING_SIZE);
    CONST(UGDS_INVALID_MAPPING_RANGE);
    CONST(UGDS_INVALID_FILE_TYPE);
    CONST(UGDS_INVALID_FILE_OPEN_FLAG);
    CONST(UGDS_DIO_NOT_SET);
    CONST(UGDS_INVALID_VALUE);
    CONST(UGDS_MEMORY_ALREADY_REGISTERED);
    CONST(UGDS_MEMORY_NOT_REGISTERED);
    CONST(UGDS_PERMISSION_DENIED);
    CONST(UGDS_DRIVER_ALREADY_OPEN);
    CONST(UGDS_HANDLE_NOT_REGISTERED);
    CONST(UGDS_HANDLE_ALREADY_REGISTERED);
    CONST(UGDS_DEVICE_NOT_FOUND);
    CONST(UGDS_INTERNAL_ERROR);
    CONST(UGDS_GETNEWFD_FAILED);
    CONST(UGDS_NVFS_SETUP_ERROR);
    CONST(UGDS_IO_DISABLED);
    CONST(UGDS_GPU_MEMORY_PINNING_FAILED);
    CONST(UGDS_BATCH_CAPACITY_EXCEEDED);
    CONST(UGDS_RDMA_MR_STILL_ACTIVE);
    CONST(UGDS_BUSY);
    CONST(UGDS_OUT_OF_MEMORY);
    CONST(UGDS_HANDLE_TYPE_OPAQUE_FD);
    CONST(UGDS_HANDLE_TYPE_OPAQUE_WIN32);
    CONST(UGDS_HANDLE_TYPE_USERSPACE_FS);
    CONST(UGDS_BACKEND_DEFAULT);
    CONST(UGDS_BACKEND_CUDA);
    CONST(UGDS_BACKEND_HIP);
    CONST(UGDS_READ);
    CONST(UGDS_WRITE);
    CONST(UGDS_BATCH_WAITING);
    CONST(UGDS_BATCH_PENDING);
    CONST(UGDS_BATCH_INVALID);
    CONST(UGDS_BATCH_CANCELED);
    CONST(UGDS_BATCH_COMPLETE);
    CONST(UGDS_BATCH_TIMEOUT);
    CONST(UGDS_BATCH_FAILED);
    CONST(NVM_MAP_DMABUF);
    CONST(UGDS_REGISTER_DMABUF);
    CONST(NVM_MAP_RDMA);
    CONST(NVM_MAP_FORCE_CUDA);

    CONST(UGDS_MAX_BATCH_IO);
    /* A name the library does not know is reported as such. */
    CHECK(ugds_abi_constant("UGDS_NO_SUCH_CONSTANT") == -1);
    CHECK(ugds_abi_offsetof("uGDSIOParams_t", "no_such_field") == -1);
    /* The helpers of the header. */
    CHECK(IS_UGDS_ERR(-UGDS_INVALID_VALUE) && IS_UGDS_ERR(UGDS_BUSY) && !IS_UGDS_ERR(-EINVAL));
    CHECK(strcmp(UGDS_ERRSTR(-UGDS_BUSY), "busy: I/O in flight") == 0);
    return finish("abi_check");
}
