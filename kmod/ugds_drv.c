// SPDX-License-Identifier: GPL-2.0
/*
 * ugds_drv: the kernel helper of ugds (user-space GPU Direct Storage).
 *
 * It binds only NVMe functions it is explicitly given (driver_override), and
 * does the privileged set-up a user-space NVMe driver cannot: BAR0 mapped
 * uncached into the process, coherent DMA memory for queues and PRP lists,
 * host pages pinned and mapped for the device, dma-bufs imported (GPU memory
 * exported by CUDA or HIP; udmabuf in tests), MSI-X vectors bridged to
 * eventfds. It takes no part in I/O.
 *
 * One process opens a function at a time (CAP_SYS_ADMIN: the device reaches
 * whatever is mapped). Everything the open file set up is in its ledger.
 * When the file is released, or the function unbound, the controller is
 * stopped first (CC.EN = 0, wait for CSTS.RDY = 0, clear bus mastering) and
 * only then is anything unmapped, unpinned or freed.
 *
 * Lifetimes. struct ugds_dev embeds the struct device of /dev/ugds_drvN and
 * its cdev (cdev_device_add): an open file, and each ledger entry, hold a
 * reference on that device, and its release frees the struct, so nothing is
 * freed while the VFS or a mapping can still reach it. Each ledger entry is
 * reference-counted: one reference for the ledger, one per user mapping of
 * its memory; coherent DMA memory is freed at the last of them, never while
 * a process maps it. Unbinding while the file is open stops the controller,
 * zaps every user mapping of the file (later accesses get SIGBUS: BAR0 is
 * served by a fault handler that refuses once the device is gone, DMA
 * memory by one that always does), then gives the memory back (the DMA API
 * wants it before the driver is unbound) and drops the ledger's references;
 * the entries live on until their mappings' close hooks have run.
 *
 * Locking. d->lock guards the ledger and the device state. It is taken
 * under mmap_lock (mmap, and the BAR0 fault handler), so nothing that takes
 * mmap_lock (pinning user pages, copy_to_user, put_user) runs under it: the
 * ioctls prepare a mapping without the lock and take it only to check the
 * device and enter the result in the ledger. d->map_lock serializes MAP
 * (check, pin, map, enter) and is taken before either of the others.
 *
 * GPU memory by nvidia_p2p: persistent pages where the NVIDIA driver offers
 * them (no callback: the pages stay until put). Otherwise the driver may
 * take the pages back at any time through a free callback, which stops the
 * controller (confirmed) before it returns; its data (struct ugds_p2p, a
 * lock and a state) lives until module exit, because the driver may call
 * it even after put_pages has returned. Order: the driver's own locks, then
 * a ugds_p2p's lock, then d->lock; nothing is held across a call into the
 * NVIDIA driver but map_lock.
 */
#include <linux/capability.h>
#include <linux/cdev.h>
#include <linux/delay.h>
#include <linux/device.h>
#include <linux/dma-buf.h>
#include <linux/dma-mapping.h>
#include <linux/dma-resv.h>
#include <linux/eventfd.h>
#include <linux/fs.h>
#include <linux/idr.h>
#include <linux/interrupt.h>
#include <linux/io-64-nonatomic-lo-hi.h>
#include <linux/iopoll.h>
#include <linux/kref.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/nvme.h>
#include <linux/pci.h>
#include <linux/sched/mm.h>
#include <linux/slab.h>
#include <linux/stringify.h>
#include <linux/uaccess.h>
#include <linux/xarray.h>

#include "ugds_drv_uapi.h"

#ifdef UGDS_NVIDIA_P2P
#include "nv-p2p.h"
#endif

#define DRV_NAME "ugds_drv"
#define UGDS_MAX_DEVS 64
#define UGDS_MAX_VECTORS 64

/* How long a normal shutdown may take before the controller is disabled. */
#define UGDS_SHUTDOWN_US (2 * USEC_PER_SEC)
/* The registers and at least the admin queue's two doorbells. */
#define UGDS_MIN_BAR0 0x2000

enum ugds_map_kind { UGDS_COHERENT, UGDS_PINNED, UGDS_DMABUF, UGDS_GPU_P2P };

struct ugds_map {
	struct list_head node;	/* on a list of entries being torn down */
	struct kref ref;	/* the ledger's, and one per user mapping */
	struct ugds_dev *dev;	/* holds a reference on dev->devobj */
	bool released;		/* what it holds was given back */
	u64 handle;
	enum ugds_map_kind kind;
	/* coherent */
	void *cpu;
	dma_addr_t bus;
	size_t size;
	atomic_t vmas; /* user mappings of coherent memory alive */
	/* pinned, charged to mm's locked_vm (RLIMIT_MEMLOCK) as vfio does */
	struct mm_struct *mm;
	unsigned long start, end;
	unsigned long npages;
	struct page **pages;
	struct sg_table sgt;
	/* dma-buf */
	struct dma_buf *dbuf;
	struct dma_buf_attachment *att;
	struct sg_table *dsgt;
#ifdef UGDS_NVIDIA_P2P
	/* nvidia_p2p: GPU virtual range, its page table and DMA mapping */
	u64 gpu_va, gpu_len;
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *dm;
	bool persistent;       /* pinned by get_pages_persistent: no callback */
	struct ugds_p2p *p2p;  /* otherwise: the free callback's data */
#endif
};

#ifdef UGDS_NVIDIA_P2P
/*
 * The data of a non-persistent mapping's free callback. The NVIDIA driver
 * may call it at any time until put_pages returns, and after put_pages
 * found the table already unlinked by its own teardown (it then returns 0
 * as well): so this is never freed while the module is loaded. `lock`
 * orders the callback against MAP and against giving the pages back; it is
 * never held across a call into the NVIDIA driver that could wait for the
 * callback, and the callback takes d->lock under it (no path holds d->lock
 * while calling into the NVIDIA driver).
 */
enum ugds_p2p_state {
	UGDS_P2P_BUILDING,  /* MAP has not handed out an address yet */
	UGDS_P2P_LIVE,      /* the controller may DMA to the pages */
	UGDS_P2P_REVOKED,   /* the callback ran: the pages are the driver's again */
	UGDS_P2P_PUT,       /* given back with put_pages */
};

struct ugds_p2p {
	struct list_head node;  /* ugds_p2p_all */
	struct mutex lock;
	enum ugds_p2p_state state;
	struct ugds_dev *dev;   /* referenced while BUILDING or LIVE */
	u64 gpu_va, gpu_len;
};

static LIST_HEAD(ugds_p2p_all);
static DEFINE_MUTEX(ugds_p2p_all_lock);
#endif

struct ugds_irq {
	struct eventfd_ctx *ctx;
	bool requested;
	char name[32];
};

struct ugds_dev {
	struct device devobj;	/* /dev/ugds_drvN; its release frees this */
	struct cdev cdev;
	struct pci_dev *pdev;	/* referenced until release */
	void __iomem *bar0;
	resource_size_t bar0_start, bar0_len;
	int minor;
	int nvec;
	/* Serializes MAP, so that a range is checked against the ledger before
	 * it is pinned and mapped (the DMA API must not see overlapping
	 * mappings). Taken before d->lock and mmap_lock, never under them.
	 */
	struct mutex map_lock;
	struct mutex lock; /* everything below */
	bool gone;         /* unbound: every call fails */
	bool open;
	struct address_space *mapping; /* the open file's: zapped on unbind */
	struct xarray maps;	/* the ledger, by handle */
	u32 next_handle;	/* where the cyclic handle allocation goes on */
	u64 pinned_pages;
	u64 live;
	u64 dma_bytes; /* coherent memory the ledger holds, against dma_limit_kb */
	struct ugds_irq irq[UGDS_MAX_VECTORS];
};

static unsigned long dma_limit_kb = 1024 * 1024;
module_param(dma_limit_kb, ulong, 0644);
MODULE_PARM_DESC(dma_limit_kb, "Most coherent DMA memory one open file may hold, in KiB (default 1 GiB)");

static struct class *ugds_class;
/* Module-wide: what every open file holds (tests check these drop to zero). */
static atomic64_t ugds_total_pinned = ATOMIC64_INIT(0);
static atomic64_t ugds_total_maps = ATOMIC64_INIT(0);
static dev_t ugds_devt;
static DEFINE_IDA(ugds_ida);

static void ugds_dev_release(struct device *dev)
{
	struct ugds_dev *d = container_of(dev, struct ugds_dev, devobj);

	pci_dev_put(d->pdev);
	ida_free(&ugds_ida, d->minor);
	xa_destroy(&d->maps);
	kfree(d);
}

/*
 * Stops the controller's DMA: a normal shutdown (CC.SHN, bounded), so the
 * controller can flush what it caches, then disable it and wait (bounded by
 * CAP.TO) for CSTS.RDY to clear, then clear bus mastering, which stops DMA
 * at the PCI level whatever the controller does.
 */
static void ugds_stop_device(struct ugds_dev *d)
{
	u64 cap = lo_hi_readq(d->bar0 + NVME_REG_CAP);
	u64 timeout_us = (NVME_CAP_TIMEOUT(cap) + 1) * 500 * USEC_PER_MSEC;
	u32 cc = readl(d->bar0 + NVME_REG_CC);
	u32 csts;

	if (cc != ~0U && (cc & NVME_CC_ENABLE)) {
		writel((cc & ~NVME_CC_SHN_MASK) | NVME_CC_SHN_NORMAL, d->bar0 + NVME_REG_CC);
		if (readl_poll_timeout(d->bar0 + NVME_REG_CSTS, csts,
				       csts == ~0U ||
				       (csts & NVME_CSTS_SHST_MASK) == NVME_CSTS_SHST_CMPLT,
				       1000, UGDS_SHUTDOWN_US))
			dev_warn(&d->pdev->dev, "shutdown did not complete; disabling\n");
		cc = readl(d->bar0 + NVME_REG_CC);
		writel(cc & ~(NVME_CC_ENABLE | NVME_CC_SHN_MASK), d->bar0 + NVME_REG_CC);
	}
	if (cc != ~0U &&
	    readl_poll_timeout(d->bar0 + NVME_REG_CSTS, csts,
			       csts == ~0U || !(csts & NVME_CSTS_RDY), 1000, timeout_us))
		dev_warn(&d->pdev->dev,
			 "controller did not become not-ready; clearing bus mastering\n");
	pci_clear_master(d->pdev);
}

static void ugds_irq_detach(struct ugds_dev *d, unsigned int v)
{
	if (d->irq[v].requested) {
		free_irq(pci_irq_vector(d->pdev, v), &d->irq[v]);
		d->irq[v].requested = false;
	}
	if (d->irq[v].ctx) {
		eventfd_ctx_put(d->irq[v].ctx);
		d->irq[v].ctx = NULL;
	}
}

static void ugds_uncharge(struct mm_struct *mm, unsigned long npages);
#ifdef UGDS_NVIDIA_P2P
static void ugds_p2p_put(struct ugds_dev *d, struct ugds_map *m);
#endif

/*
 * Gives back what the entry holds, once: at its last reference, or in
 * remove (after every user mapping of the file was zapped: the DMA API wants
 * a driver's coherent memory back before the driver is unbound). The
 * controller no longer uses it: the user unmapped it, or the device stopped.
 */
static void ugds_map_release_memory(struct ugds_map *m)
{
	struct ugds_dev *d = m->dev;
	struct device *dev = &d->pdev->dev;

	if (m->released)
		return;
	m->released = true;
	switch (m->kind) {
	case UGDS_COHERENT:
		dma_free_coherent(dev, m->size, m->cpu, m->bus);
		break;
	case UGDS_PINNED:
		dma_unmap_sgtable(dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&m->sgt);
		unpin_user_pages(m->pages, m->npages);
		atomic64_sub(m->npages, &ugds_total_pinned);
		kvfree(m->pages);
		ugds_uncharge(m->mm, m->npages);
		break;
	case UGDS_GPU_P2P:
#ifdef UGDS_NVIDIA_P2P
		ugds_p2p_put(d, m);
#endif
		break;
	case UGDS_DMABUF:
		dma_resv_lock(m->dbuf->resv, NULL);
		dma_buf_unmap_attachment(m->att, m->dsgt, DMA_BIDIRECTIONAL);
		dma_buf_unpin(m->att);
		dma_resv_unlock(m->dbuf->resv);
		dma_buf_detach(m->dbuf, m->att);
		dma_buf_put(m->dbuf);
		break;
	}
	atomic64_dec(&ugds_total_maps);
}

/* The last reference (the ledger's and every user mapping's are gone). */
static void ugds_map_free(struct kref *ref)
{
	struct ugds_map *m = container_of(ref, struct ugds_map, ref);
	struct ugds_dev *d = m->dev;

	ugds_map_release_memory(m);
	kfree(m);
	put_device(&d->devobj);
}

static void ugds_map_put(struct ugds_map *m)
{
	kref_put(&m->ref, ugds_map_free);
}

/* Handles: cyclic, so a released handle is not reused for a long while;
 * below 2^24, so that the DMA mmap offset (handle << 32) fits.
 */
#define UGDS_HANDLES XA_LIMIT(1, (1U << 24) - 1)

/* Takes the entry out of the ledger (d->lock held); the caller then drops
 * the ledger's reference with ugds_map_put, outside the lock.
 */
static void ugds_map_unlink(struct ugds_dev *d, struct ugds_map *m)
{
	xa_erase(&d->maps, m->handle);
	d->live--;
	if (m->kind == UGDS_COHERENT)
		d->dma_bytes -= m->size;
	if (m->kind == UGDS_PINNED)
		d->pinned_pages -= m->npages;
}

/* Enters a prepared entry in the ledger (d->lock held). */
static int ugds_map_link(struct ugds_dev *d, struct ugds_map *m)
{
	u32 id;
	int ret = xa_alloc_cyclic(&d->maps, &id, m, UGDS_HANDLES, &d->next_handle,
				  GFP_KERNEL_ACCOUNT);

	if (ret < 0)
		return ret;
	m->handle = id;
	d->live++;
	if (m->kind == UGDS_PINNED)
		d->pinned_pages += m->npages;
	return 0;
}

/* Whether the entry is still in the ledger (d->lock held). */
static bool ugds_map_linked(struct ugds_dev *d, struct ugds_map *m)
{
	return m->handle && xa_load(&d->maps, m->handle) == m;
}

/* Takes back an entry just entered (its handle could not be handed out),
 * unless unbinding took it out of the ledger meanwhile.
 */
static void ugds_map_withdraw(struct ugds_dev *d, struct ugds_map *m)
{
	bool linked;

	mutex_lock(&d->lock);
	linked = ugds_map_linked(d, m);
	if (linked)
		ugds_map_unlink(d, m);
	mutex_unlock(&d->lock);
	if (linked)
		ugds_map_put(m);
}

/* A new entry of `d`, holding a reference on its device. */
static struct ugds_map *ugds_map_new(struct ugds_dev *d)
{
	struct ugds_map *m = kzalloc(sizeof(*m), GFP_KERNEL_ACCOUNT);

	if (!m)
		return NULL;
	kref_init(&m->ref);
	INIT_LIST_HEAD(&m->node);
	get_device(&d->devobj);
	m->dev = d;
	return m;
}

/* Frees an entry that never reached the ledger (nothing was set up in it). */
static void ugds_map_discard(struct ugds_map *m)
{
	struct ugds_dev *d = m->dev;

	kfree(m);
	put_device(&d->devobj);
}

/*
 * Stops the device and takes everything out of the ledger (d->lock held);
 * the entries go on `out`, whose ledger references the caller drops after
 * unlocking. Memory a process still maps lives on until its last unmap.
 */
static void ugds_teardown(struct ugds_dev *d, struct list_head *out)
{
	struct ugds_map *m;
	unsigned long id;
	unsigned int v;

	ugds_stop_device(d);
	for (v = 0; v < UGDS_MAX_VECTORS; v++)
		ugds_irq_detach(d, v);
	xa_for_each(&d->maps, id, m) {
		ugds_map_unlink(d, m);
		list_add(&m->node, out);
	}
}

static void ugds_put_all(struct list_head *list)
{
	struct ugds_map *m, *tmp;

	list_for_each_entry_safe(m, tmp, list, node) {
		list_del_init(&m->node);
		ugds_map_put(m);
	}
}

static struct ugds_map *ugds_find(struct ugds_dev *d, u64 handle)
{
	return handle && handle < (1U << 24) ? xa_load(&d->maps, handle) : NULL;
}

static int ugds_open(struct inode *inode, struct file *f)
{
	/* The cdev, and so the device holding it, is alive: chrdev_open took a
	 * reference on it.
	 */
	struct ugds_dev *d = container_of(inode->i_cdev, struct ugds_dev, cdev);
	int ret = 0;

	if (!capable(CAP_SYS_ADMIN))
		return -EPERM;
	mutex_lock(&d->lock);
	if (d->gone)
		ret = -ENODEV;
	else if (d->open)
		ret = -EBUSY;
	if (!ret) {
		d->open = true;
		d->mapping = f->f_mapping;
		get_device(&d->devobj);
		pci_set_master(d->pdev);
		f->private_data = d;
	}
	mutex_unlock(&d->lock);
	return ret;
}

static int ugds_release(struct inode *inode, struct file *f)
{
	struct ugds_dev *d = f->private_data;
	LIST_HEAD(dead);

	mutex_lock(&d->lock);
	if (!d->gone)
		ugds_teardown(d, &dead);
	d->open = false;
	d->mapping = NULL;
	mutex_unlock(&d->lock);
	ugds_put_all(&dead);
	put_device(&d->devobj);
	return 0;
}

static long ugds_alloc_dma(struct ugds_dev *d, void __user *arg)
{
	struct ugds_drv_dma req;
	struct ugds_map *m;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (!req.size || req.size > (1ULL << 30))
		return -EINVAL;
	/* Reserved against the file's limit first (the DMA API cannot charge
	 * coherent memory to a memory cgroup).
	 */
	mutex_lock(&d->lock);
	if (d->dma_bytes + PAGE_ALIGN(req.size) > (u64)dma_limit_kb << 10) {
		mutex_unlock(&d->lock);
		return -ENOMEM;
	}
	d->dma_bytes += PAGE_ALIGN(req.size);
	mutex_unlock(&d->lock);
	m = ugds_map_new(d);
	if (m) {
		m->kind = UGDS_COHERENT;
		m->size = PAGE_ALIGN(req.size);
		m->cpu = dma_alloc_coherent(&d->pdev->dev, m->size, &m->bus, GFP_KERNEL);
		if (!m->cpu) {
			ugds_map_discard(m);
			m = NULL;
		}
	}
	if (!m) {
		mutex_lock(&d->lock);
		d->dma_bytes -= PAGE_ALIGN(req.size);
		mutex_unlock(&d->lock);
		return -ENOMEM;
	}
	atomic64_inc(&ugds_total_maps);
	mutex_lock(&d->lock);
	if (d->gone) {
		d->dma_bytes -= m->size;
		mutex_unlock(&d->lock);
		ugds_map_put(m);
		return -ENODEV;
	}
	if (ugds_map_link(d, m)) {
		d->dma_bytes -= m->size;
		mutex_unlock(&d->lock);
		ugds_map_put(m);
		return -ENOMEM;
	}
	req.bus_addr = m->bus;
	req.mmap_offset = UGDS_DRV_MMAP_DMA_BASE + (m->handle << 32);
	req.handle = m->handle;
	mutex_unlock(&d->lock);
	if (copy_to_user(arg, &req, sizeof(req))) {
		ugds_map_withdraw(d, m);
		return -EFAULT;
	}
	return 0;
}

/* Writes the controller address of each page of `sgt` from page `first` on
 * to the user array, `n` entries.
 */
static int ugds_put_pages(struct sg_table *sgt, unsigned long first, unsigned long n,
			  u64 __user *out)
{
	struct scatterlist *sg;
	unsigned long idx = 0, done = 0;
	unsigned int i;

	for_each_sgtable_dma_sg(sgt, sg, i) {
		dma_addr_t a = sg_dma_address(sg);
		unsigned int len = sg_dma_len(sg), off;

		if ((a & ~PAGE_MASK) || (len & ~PAGE_MASK))
			return -EINVAL; /* not whole pages: cannot be described by PRPs */
		for (off = 0; off < len; off += PAGE_SIZE, idx++) {
			if (idx < first)
				continue;
			if (done == n)
				return 0;
			if (put_user((u64)(a + off), out + done))
				return -EFAULT;
			done++;
		}
	}
	return done == n ? 0 : -EINVAL;
}

/*
 * Whether the CPU and the device would need dma_sync_* calls to see each
 * other's writes to this mapping (swiotlb bouncing, non-coherent DMA). Not
 * dma_need_sync(): with DMA-API debugging it says yes to everything. The
 * device's dma_skip_sync is set for coherent devices and cleared once
 * swiotlb bounces for it; then each address is asked.
 */
/* Gives back pages charged to mm's locked_vm; mm may be exiting. */
static void ugds_uncharge(struct mm_struct *mm, unsigned long npages)
{
	if (mmget_not_zero(mm)) {
		mmap_write_lock(mm);
		__account_locked_vm(mm, npages, false, current, true);
		mmap_write_unlock(mm);
		mmput(mm);
	}
	mmdrop(mm);
}

static bool ugds_needs_sync(struct device *dev, struct sg_table *sgt)
{
#ifdef CONFIG_DMA_NEED_SYNC
	struct scatterlist *sg;
	unsigned int i;

	if (dev->dma_skip_sync)
		return false;
	for_each_sgtable_dma_sg(sgt, sg, i)
		if (__dma_need_sync(dev, sg_dma_address(sg)))
			return true;
#endif
	return false;
}

static long ugds_map_pinned(struct ugds_dev *d, struct ugds_drv_map *req, struct ugds_map *m)
{
	unsigned long start = req->vaddr & PAGE_MASK;
	unsigned long end;
	int pinned, ret;

	if (!req->size || req->vaddr + req->size < req->vaddr)
		return -EINVAL;
	end = PAGE_ALIGN(req->vaddr + req->size);
	if (req->npages != (end - start) >> PAGE_SHIFT)
		return -EINVAL;
	m->kind = UGDS_PINNED;
	m->start = start;
	m->end = end;
	m->npages = req->npages;
	/* Charged first, so that RLIMIT_MEMLOCK bounds what a process pins. */
	ret = account_locked_vm(current->mm, m->npages, true);
	if (ret)
		return ret;
	m->mm = current->mm;
	mmgrab(m->mm);
	m->pages = kvmalloc_array(m->npages, sizeof(*m->pages), GFP_KERNEL_ACCOUNT);
	if (!m->pages) {
		ugds_uncharge(m->mm, m->npages);
		return -ENOMEM;
	}
	pinned = pin_user_pages_fast(start, m->npages, FOLL_WRITE | FOLL_LONGTERM, m->pages);
	if (pinned != m->npages) {
		if (pinned > 0)
			unpin_user_pages(m->pages, pinned);
		kvfree(m->pages);
		ugds_uncharge(m->mm, m->npages);
		return pinned < 0 ? pinned : -EFAULT;
	}
	ret = sg_alloc_table_from_pages(&m->sgt, m->pages, m->npages, 0, m->npages << PAGE_SHIFT,
					GFP_KERNEL_ACCOUNT);
	if (ret)
		goto unpin;
	ret = dma_map_sgtable(&d->pdev->dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto free_sgt;
	/* The controller must reach the pages themselves: a mapping that needs
	 * syncing (bounce buffering through swiotlb, as in SEV/TDX guests, or
	 * non-coherent DMA) would hand the process stale data silently.
	 */
	if (ugds_needs_sync(&d->pdev->dev, &m->sgt)) {
		dev_warn_ratelimited(&d->pdev->dev, "refusing a mapping that needs DMA syncing\n");
		ret = -EOPNOTSUPP;
		goto unmap;
	}
	ret = ugds_put_pages(&m->sgt, 0, m->npages, u64_to_user_ptr(req->pages_ptr));
	if (ret)
		goto unmap;
	atomic64_add(m->npages, &ugds_total_pinned);
	return 0;
unmap:
	dma_unmap_sgtable(&d->pdev->dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
free_sgt:
	sg_free_table(&m->sgt);
unpin:
	unpin_user_pages(m->pages, m->npages);
	kvfree(m->pages);
	ugds_uncharge(m->mm, m->npages);
	return ret;
}

/*
 * The exporter asks us to let go of a mapping so it can move the buffer. Our
 * attachments are pinned, which forbids moving them; an exporter that asks
 * anyway is told nothing has changed, and the mapping stays until the user
 * unmaps it (after the controller is done with it).
 */
static void ugds_move_notify(struct dma_buf_attachment *att)
{
	struct ugds_map *m = att->importer_priv;

	dev_warn_ratelimited(&m->dev->pdev->dev,
			     "exporter asked to move a pinned dma-buf; kept until unmapped\n");
}

static const struct dma_buf_attach_ops ugds_importer_ops = {
	.allow_peer2peer = true,
	.move_notify = ugds_move_notify,
};

static long ugds_map_dmabuf(struct ugds_dev *d, struct ugds_drv_map *req, struct ugds_map *m)
{
	unsigned long first, n;
	int ret;

	m->dbuf = dma_buf_get(req->dmabuf_fd);
	if (IS_ERR(m->dbuf))
		return PTR_ERR(m->dbuf);
	if (!req->size || req->offset + req->size < req->offset ||
	    req->offset + req->size > m->dbuf->size) {
		ret = -EINVAL;
		goto put;
	}
	first = req->offset >> PAGE_SHIFT;
	n = (PAGE_ALIGN(req->offset + req->size) >> PAGE_SHIFT) - first;
	if (req->npages != n) {
		ret = -EINVAL;
		goto put;
	}
	/*
	 * A dynamic attachment that accepts peer-to-peer (GPU memory behind a
	 * BAR, as NVIDIA's and AMD's exporters give it), pinned for as long as
	 * the mapping lives: the controller may DMA into it at any time, so the
	 * exporter must not move it.
	 */
	m->att = dma_buf_dynamic_attach(m->dbuf, &d->pdev->dev, &ugds_importer_ops, m);
	if (IS_ERR(m->att)) {
		ret = PTR_ERR(m->att);
		goto put;
	}
	dma_resv_lock(m->dbuf->resv, NULL);
	ret = dma_buf_pin(m->att);
	if (ret) {
		dma_resv_unlock(m->dbuf->resv);
		goto detach;
	}
	m->dsgt = dma_buf_map_attachment(m->att, DMA_BIDIRECTIONAL);
	if (IS_ERR(m->dsgt)) {
		ret = PTR_ERR(m->dsgt);
		dma_buf_unpin(m->att);
		dma_resv_unlock(m->dbuf->resv);
		goto detach;
	}
	dma_resv_unlock(m->dbuf->resv);
	ret = ugds_put_pages(m->dsgt, first, n, u64_to_user_ptr(req->pages_ptr));
	if (ret)
		goto unmap;
	m->kind = UGDS_DMABUF;
	return 0;
unmap:
	dma_resv_lock(m->dbuf->resv, NULL);
	dma_buf_unmap_attachment(m->att, m->dsgt, DMA_BIDIRECTIONAL);
	dma_buf_unpin(m->att);
	dma_resv_unlock(m->dbuf->resv);
detach:
	dma_buf_detach(m->dbuf, m->att);
put:
	dma_buf_put(m->dbuf);
	return ret;
}

#ifdef UGDS_NVIDIA_P2P
/*
 * The NVIDIA driver takes the pages back under a live mapping (the process
 * freed the memory, or exited). The controller might still DMA into them:
 * stop it, and only then return (the driver frees the pages after this
 * returns). The stop is confirmed: CSTS.RDY read back as 0 (or the device
 * gone), then bus mastering cleared. The process's commands then time out
 * and its handle wedges.
 */
static void ugds_p2p_free(void *data)
{
	struct ugds_p2p *p = data;
	struct ugds_dev *d;

	mutex_lock(&p->lock);
	d = p->dev;
	switch (p->state) {
	case UGDS_P2P_LIVE:
		mutex_lock(&d->lock);
		if (!d->gone && d->open)
			ugds_stop_device(d);
		mutex_unlock(&d->lock);
		dev_warn(&d->pdev->dev, "GPU memory %llx+%llx taken back while mapped: controller stopped\n",
			 p->gpu_va, p->gpu_len);
		fallthrough;
	case UGDS_P2P_BUILDING:
		/* Building: MAP has handed out no address; it sees the state. */
		p->state = UGDS_P2P_REVOKED;
		p->dev = NULL;
		put_device(&d->devobj);
		break;
	case UGDS_P2P_REVOKED:
	case UGDS_P2P_PUT:
		break;
	}
	mutex_unlock(&p->lock);
}

static struct ugds_p2p *ugds_p2p_new(struct ugds_dev *d, u64 va, u64 len)
{
	struct ugds_p2p *p = kzalloc(sizeof(*p), GFP_KERNEL_ACCOUNT);

	if (!p)
		return NULL;
	mutex_init(&p->lock);
	p->state = UGDS_P2P_BUILDING;
	get_device(&d->devobj);
	p->dev = d;
	p->gpu_va = va;
	p->gpu_len = len;
	mutex_lock(&ugds_p2p_all_lock);
	list_add(&p->node, &ugds_p2p_all);
	mutex_unlock(&ugds_p2p_all_lock);
	return p;
}

/*
 * Moves a callback's data out of BUILDING or LIVE to `to` (PUT, or REVOKED
 * for a MAP that failed); false if the callback took the pages back first.
 */
static bool ugds_p2p_settle(struct ugds_p2p *p, enum ugds_p2p_state to)
{
	struct ugds_dev *d = NULL;
	bool ours;

	mutex_lock(&p->lock);
	ours = p->state == UGDS_P2P_BUILDING || p->state == UGDS_P2P_LIVE;
	if (ours) {
		p->state = to;
		d = p->dev;
		p->dev = NULL;
	}
	mutex_unlock(&p->lock);
	if (d)
		put_device(&d->devobj);
	return ours;
}

/*
 * Gives the pages back, unless the driver's callback took them back first
 * (the table is then the driver's to free, and must not be touched).
 */
static void ugds_p2p_put(struct ugds_dev *d, struct ugds_map *m)
{
	if (m->persistent) {
		nvidia_p2p_dma_unmap_pages(d->pdev, m->pt, m->dm);
		nvidia_p2p_put_pages_persistent(m->gpu_va, m->pt, 0);
		return;
	}
	/* After this, a callback leaves the pages alone; one that runs during
	 * put_pages (the driver's teardown unlinked the table first) finds the
	 * state PUT and returns.
	 */
	if (!ugds_p2p_settle(m->p2p, UGDS_P2P_PUT))
		return;
	nvidia_p2p_dma_unmap_pages(d->pdev, m->pt, m->dm);
	nvidia_p2p_put_pages(0, 0, m->gpu_va, m->pt);
}

/* The callbacks' data, at module exit: no mapping is left to call back. */
static void ugds_p2p_free_all(void)
{
	struct ugds_p2p *p, *tmp;

	list_for_each_entry_safe(p, tmp, &ugds_p2p_all, node) {
		list_del(&p->node);
		kfree(p);
	}
}

/*
 * Pins GPU memory: persistently where the driver offers it (the pages stay
 * until put, whatever the process does; no callback), else with a free
 * callback.
 */
static int ugds_p2p_get(struct ugds_dev *d, struct ugds_drv_map *req, struct ugds_map *m)
{
	int ret = -EOPNOTSUPP;

	m->gpu_va = req->vaddr;
	m->gpu_len = req->size;
#ifdef NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API
	ret = nvidia_p2p_get_pages_persistent(req->vaddr, req->size, &m->pt, 0);
	if (!ret) {
		m->persistent = true;
		return 0;
	}
#endif
	m->p2p = ugds_p2p_new(d, req->vaddr, req->size);
	if (!m->p2p)
		return -ENOMEM;
	ret = nvidia_p2p_get_pages(0, 0, req->vaddr, req->size, &m->pt, ugds_p2p_free, m->p2p);
	if (ret)
		ugds_p2p_settle(m->p2p, UGDS_P2P_REVOKED);
	return ret;
}

static long ugds_map_nvidia_p2p(struct ugds_dev *d, struct ugds_drv_map *req, struct ugds_map *m)
{
	const u64 gran = 64 * 1024;
	u64 done = 0, i, off;
	int ret;

	if (!req->size || (req->vaddr | req->size) & (gran - 1) ||
	    req->vaddr + req->size < req->vaddr ||
	    req->npages != req->size >> PAGE_SHIFT)
		return -EINVAL;
	ret = ugds_p2p_get(d, req, m);
	if (ret)
		return ret;
	ret = nvidia_p2p_dma_map_pages(d->pdev, m->pt, &m->dm);
	if (ret)
		goto put;
	if (m->dm->page_size_type != NVIDIA_P2P_PAGE_SIZE_64KB) {
		ret = -EOPNOTSUPP;
		goto put;
	}
	if (!m->persistent) {
		/* From the first address written to the process (another of its
		 * threads could hand it to the controller at once), a callback
		 * must stop the controller. Taken back meanwhile: nothing was
		 * handed out, and the table is the driver's.
		 */
		mutex_lock(&m->p2p->lock);
		if (m->p2p->state == UGDS_P2P_BUILDING)
			m->p2p->state = UGDS_P2P_LIVE;
		else
			ret = -EFAULT;
		mutex_unlock(&m->p2p->lock);
		if (ret)
			return ret;
	}
	/* Each 64 KiB GPU page becomes sixteen controller pages. */
	for (i = 0; i < m->dm->entries && done < req->npages; i++)
		for (off = 0; off < gran && done < req->npages; off += PAGE_SIZE, done++)
			if (put_user(m->dm->dma_addresses[i] + off,
				     (u64 __user *)u64_to_user_ptr(req->pages_ptr) + done)) {
				ret = -EFAULT;
				goto put;
			}
	if (done != req->npages) {
		ret = -EINVAL;
		goto put;
	}
	m->kind = UGDS_GPU_P2P;
	return 0;
put:
	/* Unless the callback took the pages back meanwhile (then the table
	 * and its DMA mapping are the driver's to free).
	 */
	if (m->persistent || ugds_p2p_settle(m->p2p, UGDS_P2P_PUT)) {
		if (m->dm)
			nvidia_p2p_dma_unmap_pages(d->pdev, m->pt, m->dm);
		if (m->persistent)
			nvidia_p2p_put_pages_persistent(req->vaddr, m->pt, 0);
		else
			nvidia_p2p_put_pages(0, 0, req->vaddr, m->pt);
	}
	return ret;
}
#endif

/* Whether host range start..end overlaps one the ledger holds pinned. */
static bool ugds_overlaps(struct ugds_dev *d, unsigned long start, unsigned long end)
{
	struct ugds_map *o;
	unsigned long id;
	bool hit = false;

	mutex_lock(&d->lock);
	xa_for_each(&d->maps, id, o)
		if (o->kind == UGDS_PINNED && start < o->end && o->start < end)
			hit = true;
	mutex_unlock(&d->lock);
	return hit;
}

static long ugds_map(struct ugds_dev *d, void __user *arg)
{
	struct ugds_drv_map req;
	struct ugds_map *m;
	long ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.npages == 0 || req.npages > (1UL << 24) || (req.flags & ~UGDS_DRV_MAP_NVIDIA_P2P))
		return -EINVAL;
	m = ugds_map_new(d);
	if (!m)
		return -ENOMEM;
	mutex_lock(&d->map_lock);
	/* The ledger refuses a host range pinned already, before it is mapped
	 * a second time.
	 */
	if (req.dmabuf_fd < 0 && !(req.flags & UGDS_DRV_MAP_NVIDIA_P2P) && req.size &&
	    req.vaddr + req.size > req.vaddr &&
	    ugds_overlaps(d, req.vaddr & PAGE_MASK, PAGE_ALIGN(req.vaddr + req.size))) {
		mutex_unlock(&d->map_lock);
		ugds_map_discard(m);
		return -EEXIST;
	}
	/* Pinning and writing the page list take mmap_lock: not under d->lock. */
	if (req.flags & UGDS_DRV_MAP_NVIDIA_P2P) {
#ifdef UGDS_NVIDIA_P2P
		ret = req.dmabuf_fd >= 0 ? -EINVAL : ugds_map_nvidia_p2p(d, &req, m);
#else
		ret = -EOPNOTSUPP;
#endif
	} else {
		ret = req.dmabuf_fd >= 0 ? ugds_map_dmabuf(d, &req, m) :
					   ugds_map_pinned(d, &req, m);
	}
	if (ret) {
		mutex_unlock(&d->map_lock);
		ugds_map_discard(m);
		return ret;
	}
	atomic64_inc(&ugds_total_maps);
	mutex_lock(&d->lock);
	if (d->gone) {
		mutex_unlock(&d->lock);
		mutex_unlock(&d->map_lock);
		ugds_map_put(m);
		return -ENODEV;
	}
	if (ugds_map_link(d, m)) {
		mutex_unlock(&d->lock);
		mutex_unlock(&d->map_lock);
		ugds_map_put(m);
		return -ENOMEM;
	}
	req.handle = m->handle;
	mutex_unlock(&d->lock);
	mutex_unlock(&d->map_lock);
	if (copy_to_user(arg, &req, sizeof(req))) {
		ugds_map_withdraw(d, m);
		return -EFAULT;
	}
	return 0;
}

static irqreturn_t ugds_irq_handler(int irq, void *data)
{
	struct ugds_irq *i = data;

	eventfd_signal(i->ctx);
	return IRQ_HANDLED;
}

static long ugds_set_irq(struct ugds_dev *d, struct ugds_drv_irq *req)
{
	struct eventfd_ctx *ctx;
	int ret;

	if (req->vector >= d->nvec)
		return -EINVAL;
	ugds_irq_detach(d, req->vector);
	if (req->eventfd < 0)
		return 0;
	ctx = eventfd_ctx_fdget(req->eventfd);
	if (IS_ERR(ctx))
		return PTR_ERR(ctx);
	d->irq[req->vector].ctx = ctx;
	snprintf(d->irq[req->vector].name, sizeof(d->irq[req->vector].name), "ugds_drv%d-q%u",
		 d->minor, req->vector);
	ret = request_irq(pci_irq_vector(d->pdev, req->vector), ugds_irq_handler, 0,
			  d->irq[req->vector].name, &d->irq[req->vector]);
	if (ret) {
		eventfd_ctx_put(ctx);
		d->irq[req->vector].ctx = NULL;
		return ret;
	}
	d->irq[req->vector].requested = true;
	return 0;
}

/* Takes the entry `handle` out of the ledger for FREE_DMA (coherent) or
 * UNMAP (the others).
 */
static long ugds_unmap(struct ugds_dev *d, u64 handle, bool coherent)
{
	struct ugds_map *m;
	long ret = -EINVAL;

	mutex_lock(&d->lock);
	if (d->gone) {
		ret = -ENODEV;
		goto out;
	}
	m = ugds_find(d, handle);
	if (!m || coherent != (bool)(m->kind == UGDS_COHERENT))
		goto out; /* stale or unknown handle, or the wrong call */
	if (coherent && kref_read(&m->ref) > 1) {
		ret = -EBUSY; /* still mapped in the process */
		goto out;
	}
	ugds_map_unlink(d, m);
	mutex_unlock(&d->lock);
	ugds_map_put(m);
	return 0;
out:
	mutex_unlock(&d->lock);
	return ret;
}

static long ugds_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct ugds_dev *d = f->private_data;
	void __user *uarg = (void __user *)arg;
	struct ugds_drv_info info;
	struct ugds_drv_irq irq;
	u64 handle;
	long ret;

	/* Each call takes d->lock itself, and never around user memory. */
	switch (cmd) {
	case UGDS_DRV_IOC_INFO:
		mutex_lock(&d->lock);
		info = (struct ugds_drv_info){
			.abi_version = UGDS_DRV_ABI_VERSION,
			.msix_vectors = d->nvec,
			.bar0_size = d->bar0_len,
			.pinned_pages = d->pinned_pages,
			.live_mappings = d->live,
			.total_pinned_pages = atomic64_read(&ugds_total_pinned),
			.total_mappings = atomic64_read(&ugds_total_maps),
		};
		ret = d->gone ? -ENODEV : 0;
		mutex_unlock(&d->lock);
		if (!ret && copy_to_user(uarg, &info, sizeof(info)))
			ret = -EFAULT;
		return ret;
	case UGDS_DRV_IOC_ALLOC_DMA:
		return ugds_alloc_dma(d, uarg);
	case UGDS_DRV_IOC_MAP:
		return ugds_map(d, uarg);
	case UGDS_DRV_IOC_FREE_DMA:
	case UGDS_DRV_IOC_UNMAP:
		if (get_user(handle, (u64 __user *)uarg))
			return -EFAULT;
		return ugds_unmap(d, handle, cmd == UGDS_DRV_IOC_FREE_DMA);
	case UGDS_DRV_IOC_SET_IRQ:
		if (copy_from_user(&irq, uarg, sizeof(irq)))
			return -EFAULT;
		mutex_lock(&d->lock);
		ret = d->gone ? -ENODEV : ugds_set_irq(d, &irq);
		mutex_unlock(&d->lock);
		return ret;
	default:
		return -ENOTTY;
	}
}

/* A user mapping of coherent memory holds a reference on its entry. */
static void ugds_vma_open(struct vm_area_struct *vma)
{
	struct ugds_map *m = vma->vm_private_data;

	kref_get(&m->ref);
}

static void ugds_vma_close(struct vm_area_struct *vma)
{
	ugds_map_put(vma->vm_private_data);
}

/* The memory was mapped whole at mmap; a fault means unbinding zapped it. */
static vm_fault_t ugds_sigbus_fault(struct vm_fault *vmf)
{
	return VM_FAULT_SIGBUS;
}

static const struct vm_operations_struct ugds_dma_vm_ops = {
	.open = ugds_vma_open,
	.close = ugds_vma_close,
	.fault = ugds_sigbus_fault,
};

/* BAR0 is mapped a page at a time on access, and never once the device is
 * gone: an access after unbinding gets SIGBUS.
 */
static vm_fault_t ugds_bar_fault(struct vm_fault *vmf)
{
	struct vm_area_struct *vma = vmf->vma;
	struct ugds_dev *d = vma->vm_private_data;
	unsigned long pgoff = (vmf->address - vma->vm_start) >> PAGE_SHIFT;
	vm_fault_t ret = VM_FAULT_SIGBUS;

	mutex_lock(&d->lock);
	if (!d->gone && (pgoff << PAGE_SHIFT) < d->bar0_len)
		ret = vmf_insert_pfn(vma, vmf->address, (d->bar0_start >> PAGE_SHIFT) + pgoff);
	mutex_unlock(&d->lock);
	return ret;
}

static const struct vm_operations_struct ugds_bar_vm_ops = {
	.fault = ugds_bar_fault,
};

static int ugds_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct ugds_dev *d = f->private_data;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	unsigned long len = vma->vm_end - vma->vm_start;
	struct ugds_map *m;
	int ret = -EINVAL;

	/* Shared only: a private copy of registers or queues means nothing. */
	if (!(vma->vm_flags & VM_SHARED))
		return -EINVAL;
	mutex_lock(&d->lock);
	if (d->gone) {
		ret = -ENODEV;
		goto out;
	}
	if (off == 0) {
		/* BAR0, uncached, filled in by ugds_bar_fault. */
		if (len > PAGE_ALIGN(d->bar0_len))
			goto out;
		vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
		vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
		vma->vm_private_data = d;
		vma->vm_ops = &ugds_bar_vm_ops;
		ret = 0;
		goto out;
	}
	if (off < UGDS_DRV_MMAP_DMA_BASE || (off - UGDS_DRV_MMAP_DMA_BASE) & 0xffffffffULL)
		goto out;
	m = ugds_find(d, (off - UGDS_DRV_MMAP_DMA_BASE) >> 32);
	if (!m || m->kind != UGDS_COHERENT || len > m->size)
		goto out;
	vma->vm_pgoff = 0; /* dma_mmap_coherent reads it as an offset into the buffer */
	ret = dma_mmap_coherent(&d->pdev->dev, vma, m->cpu, m->bus, len);
	if (!ret) {
		vma->vm_private_data = m;
		vma->vm_ops = &ugds_dma_vm_ops;
		kref_get(&m->ref);
	}
out:
	mutex_unlock(&d->lock);
	return ret;
}

static const struct file_operations ugds_fops = {
	.owner = THIS_MODULE,
	.open = ugds_open,
	.release = ugds_release,
	.unlocked_ioctl = ugds_ioctl,
	.compat_ioctl = compat_ptr_ioctl,
	.mmap = ugds_mmap,
};

static int ugds_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct ugds_dev *d;
	int ret;

	if (pdev->class != PCI_CLASS_STORAGE_EXPRESS)
		return -ENODEV; /* NVMe functions only */
	if (!(pci_resource_flags(pdev, 0) & IORESOURCE_MEM) ||
	    pci_resource_len(pdev, 0) < UGDS_MIN_BAR0) {
		dev_err(&pdev->dev, "BAR0 is not a memory BAR of at least %#x bytes\n",
			UGDS_MIN_BAR0);
		return -ENODEV;
	}
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	mutex_init(&d->map_lock);
	mutex_init(&d->lock);
	xa_init_flags(&d->maps, XA_FLAGS_ALLOC1);
	d->minor = ida_alloc_max(&ugds_ida, UGDS_MAX_DEVS - 1, GFP_KERNEL);
	if (d->minor < 0) {
		ret = d->minor;
		kfree(d);
		return ret;
	}
	d->pdev = pci_dev_get(pdev);
	/* From here on the device's release frees `d`. */
	device_initialize(&d->devobj);
	d->devobj.class = ugds_class;
	d->devobj.parent = &pdev->dev;
	d->devobj.devt = MKDEV(MAJOR(ugds_devt), d->minor);
	d->devobj.release = ugds_dev_release;
	dev_set_drvdata(&d->devobj, d);
	ret = dev_set_name(&d->devobj, "ugds_drv%d", d->minor);
	if (ret)
		goto put;
	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto put;
	ret = pci_request_mem_regions(pdev, DRV_NAME);
	if (ret)
		goto disable;
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		goto release;
	d->bar0_start = pci_resource_start(pdev, 0);
	d->bar0_len = pci_resource_len(pdev, 0);
	d->bar0 = pci_iomap(pdev, 0, 0);
	if (!d->bar0) {
		ret = -ENOMEM;
		goto release;
	}
	d->nvec = pci_alloc_irq_vectors(pdev, 1, UGDS_MAX_VECTORS, PCI_IRQ_MSIX);
	if (d->nvec < 0)
		d->nvec = 0;
	cdev_init(&d->cdev, &ugds_fops);
	d->cdev.owner = THIS_MODULE;
	pci_set_drvdata(pdev, d);
	ret = cdev_device_add(&d->cdev, &d->devobj);
	if (ret)
		goto vectors;
	dev_info(&pdev->dev, "ugds_drv%d: BAR0 %pa+%llu, %d MSI-X vectors\n", d->minor,
		 &d->bar0_start, (unsigned long long)d->bar0_len, d->nvec);
	return 0;
vectors:
	pci_set_drvdata(pdev, NULL);
	if (d->nvec > 0)
		pci_free_irq_vectors(pdev);
	pci_iounmap(pdev, d->bar0);
release:
	pci_release_mem_regions(pdev);
disable:
	pci_disable_device(pdev);
put:
	put_device(&d->devobj);
	return ret;
}

static void ugds_remove(struct pci_dev *pdev)
{
	struct ugds_dev *d = pci_get_drvdata(pdev);
	struct ugds_map *m;
	LIST_HEAD(dead);

	/* No new opens; an open file keeps `d` (and the cdev) alive. */
	cdev_device_del(&d->cdev, &d->devobj);
	mutex_lock(&d->lock);
	d->gone = true;
	if (d->open) {
		/* Unbound while open: stop the device, zap every user mapping of
		 * the file (BAR0 and DMA memory: later accesses get SIGBUS), and
		 * drop the ledger's references. Memory is freed at its last
		 * unmap, never here while a process maps it.
		 */
		ugds_teardown(d, &dead);
		if (d->mapping)
			unmap_mapping_range(d->mapping, 0, 0, 1);
	} else {
		pci_clear_master(pdev);
	}
	mutex_unlock(&d->lock);
	/* No process maps any of it now (zapped above, and a fault gets
	 * SIGBUS): give the memory back while the driver is still bound. An
	 * entry itself lives until its last user mapping goes.
	 */
	list_for_each_entry(m, &dead, node)
		ugds_map_release_memory(m);
	ugds_put_all(&dead);
	if (d->nvec > 0)
		pci_free_irq_vectors(pdev);
	pci_iounmap(pdev, d->bar0);
	pci_release_mem_regions(pdev);
	pci_disable_device(pdev);
	pci_set_drvdata(pdev, NULL);
	put_device(&d->devobj);
}

/* No id table: only functions bound through driver_override reach probe. */
static struct pci_driver ugds_driver = {
	.name = DRV_NAME,
	.id_table = NULL,
	.probe = ugds_probe,
	.remove = ugds_remove,
};

static int __init ugds_init(void)
{
	int ret = alloc_chrdev_region(&ugds_devt, 0, UGDS_MAX_DEVS, DRV_NAME);

	if (ret)
		return ret;
	ugds_class = class_create(DRV_NAME);
	if (IS_ERR(ugds_class)) {
		ret = PTR_ERR(ugds_class);
		goto chrdev;
	}
	ret = pci_register_driver(&ugds_driver);
	if (ret)
		goto class;
	return 0;
class:
	class_destroy(ugds_class);
chrdev:
	unregister_chrdev_region(ugds_devt, UGDS_MAX_DEVS);
	return ret;
}

static void __exit ugds_exit(void)
{
	pci_unregister_driver(&ugds_driver);
#ifdef UGDS_NVIDIA_P2P
	ugds_p2p_free_all();
#endif
	class_destroy(ugds_class);
	unregister_chrdev_region(ugds_devt, UGDS_MAX_DEVS);
}

module_init(ugds_init);
module_exit(ugds_exit);
/*
 * The module's version: the ioctl ABI it speaks, then a revision for changes
 * that keep that ABI. kmod/dkms.conf's PACKAGE_VERSION is the same string
 * (scripts/test checks).
 */
#define UGDS_DRV_REVISION 0
MODULE_VERSION(__stringify(UGDS_DRV_ABI_VERSION) "." __stringify(UGDS_DRV_REVISION));
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("ugds kernel helper: BAR, DMA and interrupt set-up for user-space NVMe");
MODULE_IMPORT_NS(DMA_BUF);
