/* SPDX-License-Identifier: GPL-2.0 WITH Linux-syscall-note */
/*
 * ugds_drv ioctl ABI. The library checks UGDS_DRV_ABI_VERSION at open; any
 * change to a structure or a number below changes the version.
 */
#ifndef UGDS_DRV_UAPI_H
#define UGDS_DRV_UAPI_H

#include <linux/ioctl.h>
#include <linux/types.h>

#define UGDS_DRV_ABI_VERSION 2
#define UGDS_DRV_IOC_MAGIC 'U'

/* Offsets for mmap: BAR0 at 0; DMA memory at its `mmap_offset`. */
#define UGDS_DRV_MMAP_DMA_BASE (1ULL << 40)

struct ugds_drv_info {
	__u32 abi_version;
	__u32 msix_vectors;  /* vectors allocated at probe (0: polling only) */
	__u64 bar0_size;
	__u64 pinned_pages;  /* pages pinned by this open file */
	__u64 live_mappings; /* ledger entries of this open file */
	__u64 total_pinned_pages; /* pages pinned by every open file, module-wide */
	__u64 total_mappings;     /* ledger entries of every open file, module-wide */
};

struct ugds_drv_dma {
	__u64 size;        /* in: bytes (rounded up to pages) */
	__u64 bus_addr;    /* out: controller address of the first byte */
	__u64 mmap_offset; /* out: mmap offset for the memory */
	__u64 handle;      /* out */
};

/* Pin `size` bytes at `vaddr` (page-spanned) and map them for the device, or
 * import a dma-buf (`dmabuf_fd` >= 0, `vaddr` ignored, `offset`/`size` within
 * it). The controller address of each page spanned is written to the user
 * array at `pages_ptr`, which holds `npages` entries.
 */
struct ugds_drv_map {
	__u64 vaddr;
	__u64 size;
	__s32 dmabuf_fd;
	__u32 flags; /* UGDS_DRV_MAP_* */
	__u64 offset;
	__u64 pages_ptr;
	__u64 npages;
	__u64 handle; /* out */
};

/*
 * Map GPU memory by its CUDA virtual address (vaddr, 64 KiB aligned; size a
 * multiple of 64 KiB) with NVIDIA's peer-to-peer API. Only in a module built
 * with NVIDIA_SRC (see the Makefile); otherwise -EOPNOTSUPP. dmabuf_fd is -1.
 */
#define UGDS_DRV_MAP_NVIDIA_P2P (1u << 0)

struct ugds_drv_irq {
	__u32 vector;
	__s32 eventfd; /* -1: detach */
};

#define UGDS_DRV_IOC_INFO      _IOR(UGDS_DRV_IOC_MAGIC, 0, struct ugds_drv_info)
#define UGDS_DRV_IOC_ALLOC_DMA _IOWR(UGDS_DRV_IOC_MAGIC, 1, struct ugds_drv_dma)
#define UGDS_DRV_IOC_FREE_DMA  _IOW(UGDS_DRV_IOC_MAGIC, 2, __u64)
#define UGDS_DRV_IOC_MAP       _IOWR(UGDS_DRV_IOC_MAGIC, 3, struct ugds_drv_map)
#define UGDS_DRV_IOC_UNMAP     _IOW(UGDS_DRV_IOC_MAGIC, 4, __u64)
#define UGDS_DRV_IOC_SET_IRQ   _IOW(UGDS_DRV_IOC_MAGIC, 5, struct ugds_drv_irq)

#endif
