//! The driver API's entry points and constants, as `cuda.h` declares them.

use super::super::dl::Library;
use std::ffi::{c_char, c_void};
use ugds_platform::Result;

pub(super) type Res = i32;
pub(super) type Ctx = *mut c_void;
pub(super) type RawStream = *mut c_void;
pub(super) type Event = *mut c_void;
pub(super) type HostFn = unsafe extern "C" fn(*mut c_void);

pub(super) const SUCCESS: Res = 0;
pub(super) const ERROR_INVALID_VALUE: Res = 1;
pub(super) const ERROR_INVALID_CONTEXT: Res = 201;
pub(super) const ERROR_NOT_SUPPORTED: Res = 801;
pub(super) const ERROR_NOT_READY: Res = 600;
pub(super) const EVENT_DISABLE_TIMING: u32 = 2;

pub(super) const POINTER_ATTRIBUTE_CONTEXT: i32 = 1;
pub(super) const POINTER_ATTRIBUTE_MEMORY_TYPE: i32 = 2;
pub(super) const POINTER_ATTRIBUTE_IS_MANAGED: i32 = 8;
pub(super) const MEMORYTYPE_HOST: u32 = 1;
pub(super) const MEMORYTYPE_DEVICE: u32 = 2;
pub(super) const MEMORYTYPE_ARRAY: u32 = 3;
pub(super) const STREAM_NON_BLOCKING: u32 = 1;
pub(super) const STREAM_WAIT_VALUE_GEQ: u32 = 0;
pub(super) const MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD: i32 = 1;
pub(super) const MEMHOSTALLOC_PORTABLE: u32 = 1;
pub(super) const MEMHOSTALLOC_DEVICEMAP: u32 = 2;
pub(super) const DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: i32 = 124;
/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS` (the one flag `cuIpcOpenMemHandle` takes).
pub(super) const IPC_MEM_LAZY_ENABLE_PEER_ACCESS: u32 = 1;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct IpcMemHandle(pub(super) [u8; 64]);
/// `CU_DEV_RESOURCE_TYPE_SM`.
pub(super) const DEV_RESOURCE_TYPE_SM: i32 = 1;
/// `CU_GREEN_CTX_DEFAULT_STREAM` (the one flag `cuGreenCtxCreate` takes).
pub(super) const GREEN_CTX_DEFAULT_STREAM: u32 = 1;
/// Bytes set aside for a `CUdevResource` (144 in CUDA 12.4 to 13.0).
pub(super) const DEV_RESOURCE_BYTES: usize = 1024;

/// The green-context entry points (CUDA 12.4 and later).
#[allow(clippy::type_complexity)]
pub(super) struct GreenApi {
    pub(super) device_get_dev_resource: unsafe extern "C" fn(i32, *mut c_void, i32) -> Res,
    pub(super) dev_resource_generate_desc: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, u32) -> Res,
    pub(super) green_ctx_create: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, i32, u32) -> Res,
    pub(super) ctx_from_green_ctx: unsafe extern "C" fn(*mut Ctx, *mut c_void) -> Res,
}

/// The driver API entry points ugds uses.
#[allow(clippy::type_complexity)]
#[cfg_attr(not(feature = "gpu-tools"), allow(dead_code))]
pub(super) struct Api {
    pub(super) init: unsafe extern "C" fn(u32) -> Res,
    pub(super) get_error_name: unsafe extern "C" fn(Res, *mut *const c_char) -> Res,
    pub(super) device_get_count: unsafe extern "C" fn(*mut i32) -> Res,
    pub(super) device_get: unsafe extern "C" fn(*mut i32, i32) -> Res,
    pub(super) device_get_attribute: unsafe extern "C" fn(*mut i32, i32, i32) -> Res,
    pub(super) device_get_name: unsafe extern "C" fn(*mut c_char, i32, i32) -> Res,
    pub(super) device_get_pci_bus_id: unsafe extern "C" fn(*mut c_char, i32, i32) -> Res,
    pub(super) primary_ctx_retain: unsafe extern "C" fn(*mut Ctx, i32) -> Res,
    pub(super) ctx_set_current: unsafe extern "C" fn(Ctx) -> Res,
    pub(super) ctx_get_current: unsafe extern "C" fn(*mut Ctx) -> Res,
    pub(super) ctx_get_device: unsafe extern "C" fn(*mut i32) -> Res,
    pub(super) ctx_synchronize: unsafe extern "C" fn() -> Res,
    pub(super) pointer_get_attribute: unsafe extern "C" fn(*mut c_void, i32, u64) -> Res,
    pub(super) mem_get_address_range: unsafe extern "C" fn(*mut u64, *mut usize, u64) -> Res,
    pub(super) mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> Res,
    pub(super) mem_free: unsafe extern "C" fn(u64) -> Res,
    pub(super) mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, u32) -> Res,
    pub(super) mem_host_get_device_pointer: unsafe extern "C" fn(*mut u64, *mut c_void, u32) -> Res,
    pub(super) mem_free_host: unsafe extern "C" fn(*mut c_void) -> Res,
    pub(super) mem_host_register: unsafe extern "C" fn(*mut c_void, usize, u32) -> Res,
    pub(super) mem_host_unregister: unsafe extern "C" fn(*mut c_void) -> Res,
    pub(super) memcpy_dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> Res,
    pub(super) memcpy_htod_async: unsafe extern "C" fn(u64, *const c_void, usize, RawStream) -> Res,
    pub(super) memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, u64, usize, RawStream) -> Res,
    pub(super) memcpy_async: unsafe extern "C" fn(u64, u64, usize, RawStream) -> Res,
    pub(super) mem_get_handle_for_address_range: unsafe extern "C" fn(*mut c_void, u64, usize, i32, u64) -> Res,
    pub(super) stream_create: unsafe extern "C" fn(*mut RawStream, u32) -> Res,
    pub(super) stream_destroy: unsafe extern "C" fn(RawStream) -> Res,
    pub(super) stream_synchronize: unsafe extern "C" fn(RawStream) -> Res,
    pub(super) launch_host_func: unsafe extern "C" fn(RawStream, HostFn, *mut c_void) -> Res,
    pub(super) stream_wait_value32: unsafe extern "C" fn(RawStream, u64, u32, u32) -> Res,
    pub(super) stream_write_value32: unsafe extern "C" fn(RawStream, u64, u32, u32) -> Res,
    pub(super) ctx_pop_current: unsafe extern "C" fn(*mut Ctx) -> Res,
    pub(super) event_create: unsafe extern "C" fn(*mut Event, u32) -> Res,
    pub(super) event_record: unsafe extern "C" fn(Event, RawStream) -> Res,
    pub(super) event_query: unsafe extern "C" fn(Event) -> Res,
    /// Optional: a context other than the primary one.
    pub(super) ctx_create: Option<unsafe extern "C" fn(*mut Ctx, u32, i32) -> Res>,
    pub(super) ctx_push_current: unsafe extern "C" fn(Ctx) -> Res,
    /// Optional: green contexts.
    pub(super) green: Option<GreenApi>,
    pub(super) ctx_destroy: unsafe extern "C" fn(Ctx) -> Res,
    pub(super) device_get_uuid: unsafe extern "C" fn(*mut [u8; 16], i32) -> Res,
    pub(super) ipc_get_mem_handle: unsafe extern "C" fn(*mut IpcMemHandle, u64) -> Res,
    pub(super) ipc_open_mem_handle: unsafe extern "C" fn(*mut u64, IpcMemHandle, u32) -> Res,
    pub(super) ipc_close_mem_handle: unsafe extern "C" fn(u64) -> Res,
    pub(super) module_load_data: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> Res,
    pub(super) module_get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> Res,
    #[allow(clippy::type_complexity)]
    pub(super) launch_kernel: unsafe extern "C" fn(
        *mut c_void,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        u32,
        RawStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> Res,
}

impl Api {
    pub(super) fn load(lib: &Library) -> Result<Api> {
        // SAFETY: each type below is the symbol's C prototype in cuda.h
        // (CUresult = int, CUdevice = int, CUdeviceptr = unsigned long long,
        // handles are pointers, CUuuid is 16 bytes, CUipcMemHandle 64).
        unsafe {
            Ok(Api {
                init: lib.sym(c"cuInit")?,
                get_error_name: lib.sym(c"cuGetErrorName")?,
                device_get_count: lib.sym(c"cuDeviceGetCount")?,
                device_get: lib.sym(c"cuDeviceGet")?,
                device_get_attribute: lib.sym(c"cuDeviceGetAttribute")?,
                device_get_name: lib.sym(c"cuDeviceGetName")?,
                device_get_pci_bus_id: lib.sym(c"cuDeviceGetPCIBusId")?,
                primary_ctx_retain: lib.sym(c"cuDevicePrimaryCtxRetain")?,
                ctx_set_current: lib.sym(c"cuCtxSetCurrent")?,
                ctx_get_current: lib.sym(c"cuCtxGetCurrent")?,
                ctx_get_device: lib.sym(c"cuCtxGetDevice")?,
                ctx_synchronize: lib.sym(c"cuCtxSynchronize")?,
                pointer_get_attribute: lib.sym(c"cuPointerGetAttribute")?,
                mem_get_address_range: lib.sym(c"cuMemGetAddressRange_v2")?,
                mem_alloc: lib.sym(c"cuMemAlloc_v2")?,
                mem_free: lib.sym(c"cuMemFree_v2")?,
                mem_host_alloc: lib.sym(c"cuMemHostAlloc")?,
                mem_host_get_device_pointer: lib.sym(c"cuMemHostGetDevicePointer_v2")?,
                mem_free_host: lib.sym(c"cuMemFreeHost")?,
                mem_host_register: lib.sym(c"cuMemHostRegister_v2")?,
                mem_host_unregister: lib.sym(c"cuMemHostUnregister")?,
                memcpy_dtoh: lib.sym(c"cuMemcpyDtoH_v2")?,
                memcpy_htod_async: lib.sym(c"cuMemcpyHtoDAsync_v2")?,
                memcpy_dtoh_async: lib.sym(c"cuMemcpyDtoHAsync_v2")?,
                memcpy_async: lib.sym(c"cuMemcpyAsync")?,
                mem_get_handle_for_address_range: lib.sym(c"cuMemGetHandleForAddressRange")?,
                stream_create: lib.sym(c"cuStreamCreate")?,
                stream_destroy: lib.sym(c"cuStreamDestroy_v2")?,
                stream_synchronize: lib.sym(c"cuStreamSynchronize")?,
                launch_host_func: lib.sym(c"cuLaunchHostFunc")?,
                stream_wait_value32: lib.sym_any(&[c"cuStreamWaitValue32_v2", c"cuStreamWaitValue32"])?,
                stream_write_value32: lib.sym_any(&[c"cuStreamWriteValue32_v2", c"cuStreamWriteValue32"])?,
                ctx_pop_current: lib.sym(c"cuCtxPopCurrent_v2")?,
                event_create: lib.sym(c"cuEventCreate")?,
                event_record: lib.sym(c"cuEventRecord")?,
                event_query: lib.sym(c"cuEventQuery")?,
                ctx_create: lib.sym(c"cuCtxCreate_v2").ok(),
                ctx_push_current: lib.sym(c"cuCtxPushCurrent_v2")?,
                green: (|| {
                    Ok::<_, ugds_platform::Error>(GreenApi {
                        device_get_dev_resource: lib.sym(c"cuDeviceGetDevResource")?,
                        dev_resource_generate_desc: lib.sym(c"cuDevResourceGenerateDesc")?,
                        green_ctx_create: lib.sym(c"cuGreenCtxCreate")?,
                        ctx_from_green_ctx: lib.sym(c"cuCtxFromGreenCtx")?,
                    })
                })()
                .ok(),
                ctx_destroy: lib.sym(c"cuCtxDestroy_v2")?,
                device_get_uuid: lib.sym_any(&[c"cuDeviceGetUuid_v2", c"cuDeviceGetUuid"])?,
                ipc_get_mem_handle: lib.sym(c"cuIpcGetMemHandle")?,
                ipc_open_mem_handle: lib.sym_any(&[c"cuIpcOpenMemHandle_v2", c"cuIpcOpenMemHandle"])?,
                ipc_close_mem_handle: lib.sym(c"cuIpcCloseMemHandle")?,
                module_load_data: lib.sym(c"cuModuleLoadData")?,
                module_get_function: lib.sym(c"cuModuleGetFunction")?,
                launch_kernel: lib.sym(c"cuLaunchKernel")?,
            })
        }
    }
}
