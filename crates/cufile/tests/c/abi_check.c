// libcufile's types and numbers against NVIDIA's cufile.h: every size,
// field offset and constant the library lays out or uses, as the header
// has it and as the library reports it (ugds_cufile_abi_*).
#include <cufile.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

long ugds_cufile_abi_sizeof(const char *type);
long ugds_cufile_abi_offsetof(const char *type, const char *field);
int64_t ugds_cufile_abi_constant(const char *name);

static int bad, n;

static void same(const char *what, long long header, long long ours) {
    n++;
    if (header != ours) {
        fprintf(stderr, "abi_check: %s: cufile.h says %lld, libcufile %lld\n", what, header, ours);
        bad++;
    }
}

#define SIZE(T) same("sizeof " #T, sizeof(T), ugds_cufile_abi_sizeof(#T))
#define OFF(T, F) same("offsetof " #T "." #F, offsetof(T, F), ugds_cufile_abi_offsetof(#T, #F))
#define CONST(C) same(#C, (long long)(C), ugds_cufile_abi_constant(#C))

int main(void) {
    SIZE(CUfileError_t);
    OFF(CUfileError_t, err);
    OFF(CUfileError_t, cu_err);
    SIZE(CUfileDescr_t);
    OFF(CUfileDescr_t, type);
    OFF(CUfileDescr_t, handle.fd);
    OFF(CUfileDescr_t, fs_ops);
    SIZE(CUfileDrvProps_t);
    OFF(CUfileDrvProps_t, nvfs.major_version);
    OFF(CUfileDrvProps_t, nvfs.minor_version);
    OFF(CUfileDrvProps_t, nvfs.poll_thresh_size);
    OFF(CUfileDrvProps_t, nvfs.max_direct_io_size);
    OFF(CUfileDrvProps_t, nvfs.dstatusflags);
    OFF(CUfileDrvProps_t, nvfs.dcontrolflags);
    OFF(CUfileDrvProps_t, fflags);
    OFF(CUfileDrvProps_t, max_device_cache_size);
    OFF(CUfileDrvProps_t, per_buffer_cache_size);
    OFF(CUfileDrvProps_t, max_device_pinned_mem_size);
    OFF(CUfileDrvProps_t, max_batch_io_size);
    OFF(CUfileDrvProps_t, max_batch_io_timeout_msecs);
    SIZE(CUfileIOParams_t);
    OFF(CUfileIOParams_t, mode);
    OFF(CUfileIOParams_t, u.batch.devPtr_base);
    OFF(CUfileIOParams_t, u.batch.file_offset);
    OFF(CUfileIOParams_t, u.batch.devPtr_offset);
    OFF(CUfileIOParams_t, u.batch.size);
    OFF(CUfileIOParams_t, fh);
    OFF(CUfileIOParams_t, opcode);
    OFF(CUfileIOParams_t, cookie);
    SIZE(CUfileIOEvents_t);
    OFF(CUfileIOEvents_t, cookie);
    OFF(CUfileIOEvents_t, status);
    OFF(CUfileIOEvents_t, ret);
    SIZE(CUfileIOVec_t);
    OFF(CUfileIOVec_t, base);
    OFF(CUfileIOVec_t, len);
    SIZE(CUfileStatsLevel1_t);
    OFF(CUfileStatsLevel1_t, read_ops);
    OFF(CUfileStatsLevel1_t, write_ops);
    OFF(CUfileStatsLevel1_t, hdl_register_ops);
    OFF(CUfileStatsLevel1_t, hdl_deregister_ops);
    OFF(CUfileStatsLevel1_t, buf_register_ops);
    OFF(CUfileStatsLevel1_t, buf_deregister_ops);
    OFF(CUfileStatsLevel1_t, read_bytes);
    OFF(CUfileStatsLevel1_t, write_bytes);
    OFF(CUfileStatsLevel1_t, read_bw_bytes_per_sec);
    OFF(CUfileStatsLevel1_t, write_bw_bytes_per_sec);
    OFF(CUfileStatsLevel1_t, read_lat_avg_us);
    OFF(CUfileStatsLevel1_t, write_lat_avg_us);
    OFF(CUfileStatsLevel1_t, read_ops_per_sec);
    OFF(CUfileStatsLevel1_t, write_ops_per_sec);
    OFF(CUfileStatsLevel1_t, read_lat_sum_us);
    OFF(CUfileStatsLevel1_t, write_lat_sum_us);
    OFF(CUfileStatsLevel1_t, batch_submit_ops);
    OFF(CUfileStatsLevel1_t, batch_complete_ops);
    OFF(CUfileStatsLevel1_t, batch_setup_ops);
    OFF(CUfileStatsLevel1_t, batch_cancel_ops);
    OFF(CUfileStatsLevel1_t, batch_destroy_ops);
    OFF(CUfileStatsLevel1_t, batch_iouring_submit_ops);
    OFF(CUfileStatsLevel1_t, batch_total_submit_ops);
    OFF(CUfileStatsLevel1_t, batch_read_bytes);
    OFF(CUfileStatsLevel1_t, batch_write_bytes);
    OFF(CUfileStatsLevel1_t, readv_ops);
    OFF(CUfileStatsLevel1_t, writev_ops);
    OFF(CUfileStatsLevel1_t, readv_bytes);
    OFF(CUfileStatsLevel1_t, writev_bytes);
    OFF(CUfileStatsLevel1_t, readv_lat_sum_us);
    OFF(CUfileStatsLevel1_t, writev_lat_sum_us);
    SIZE(CUfileStatsLevel2_t);
    OFF(CUfileStatsLevel2_t, read_size_kb_hist);
    OFF(CUfileStatsLevel2_t, write_size_kb_hist);
    SIZE(CUfilePerGpuStats_t);
    SIZE(CUfileStatsLevel3_t);
    OFF(CUfileStatsLevel3_t, num_gpus);
    OFF(CUfileStatsLevel3_t, per_gpu_stats);
#define CUFILE_OP(code, name, string) CONST(name);
    CUFILEOP_STATUS_ENTRIES
#undef CUFILE_OP
    CONST(CU_FILE_HANDLE_TYPE_OPAQUE_FD);
    CONST(CUFILE_READ);
    CONST(CUFILE_WRITE);
    CONST(CUFILE_BATCH);
    CONST(CUFILE_WAITING);
    CONST(CUFILE_PENDING);
    CONST(CUFILE_INVALID);
    CONST(CUFILE_CANCELED);
    CONST(CUFILE_COMPLETE);
    CONST(CUFILE_TIMEOUT);
    CONST(CUFILE_FAILED);
    CONST(CU_FILE_STREAM_FIXED_BUF_OFFSET);
    CONST(CU_FILE_STREAM_FIXED_FILE_OFFSET);
    CONST(CU_FILE_STREAM_FIXED_FILE_SIZE);
    CONST(CU_FILE_STREAM_PAGE_ALIGNED_INPUTS);
    CONST(CU_FILE_BATCH_IO_SUPPORTED);
    CONST(CU_FILE_STREAMS_SUPPORTED);
    CONST(CU_FILE_USE_POLL_MODE);
    CONST(CU_FILE_ALLOW_COMPAT_MODE);
    CONST(CU_FILE_NVME_SUPPORTED);
    CONST(CUFILE_PARAM_PROFILE_STATS);
    CONST(CUFILE_PARAM_EXECUTION_MAX_IO_QUEUE_DEPTH);
    CONST(CUFILE_PARAM_EXECUTION_MAX_IO_THREADS);
    CONST(CUFILE_PARAM_EXECUTION_MIN_IO_THRESHOLD_SIZE_KB);
    CONST(CUFILE_PARAM_EXECUTION_MAX_REQUEST_PARALLELISM);
    CONST(CUFILE_PARAM_PROPERTIES_MAX_DIRECT_IO_SIZE_KB);
    CONST(CUFILE_PARAM_PROPERTIES_MAX_DEVICE_CACHE_SIZE_KB);
    CONST(CUFILE_PARAM_PROPERTIES_PER_BUFFER_CACHE_SIZE_KB);
    CONST(CUFILE_PARAM_PROPERTIES_MAX_DEVICE_PINNED_MEM_SIZE_KB);
    CONST(CUFILE_PARAM_PROPERTIES_IO_BATCHSIZE);
    CONST(CUFILE_PARAM_POLLTHRESHOLD_SIZE_KB);
    CONST(CUFILE_PARAM_PROPERTIES_BATCH_IO_TIMEOUT_MS);
    CONST(CUFILE_PARAM_PROPERTIES_USE_POLL_MODE);
    CONST(CUFILE_PARAM_PROPERTIES_ALLOW_COMPAT_MODE);
    CONST(CUFILE_PARAM_FORCE_COMPAT_MODE);
    CONST(CUFILE_PARAM_FS_MISC_API_CHECK_AGGRESSIVE);
    CONST(CUFILE_PARAM_EXECUTION_PARALLEL_IO);
    CONST(CUFILE_PARAM_PROFILE_NVTX);
    CONST(CUFILE_PARAM_PROPERTIES_ALLOW_SYSTEM_MEMORY);
    CONST(CUFILE_PARAM_USE_PCIP2PDMA);
    CONST(CUFILE_PARAM_PREFER_IO_URING);
    CONST(CUFILE_PARAM_FORCE_ODIRECT_MODE);
    CONST(CUFILE_PARAM_SKIP_TOPOLOGY_DETECTION);
    CONST(CUFILE_PARAM_STREAM_MEMOPS_BYPASS);
    CONST(CUFILE_PARAM_PROPERTIES_POSIX_IO_MODE);
    CONST(CUFILE_PARAM_GDS_FALLBACK_IO);
    CONST(CUFILE_PARAM_LOGGING_LEVEL);
    CONST(CUFILE_PARAM_ENV_LOGFILE_PATH);
    CONST(CUFILE_PARAM_LOG_DIR);
    CONST(CUFILE_PARAM_RDMA_TRANSPORT);
    printf("abi_check: %d sizes, offsets and constants of cufile.h, %d differ\n", n, bad);
    return bad != 0;
}
