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
#include <linux/kref.h>
#include <linux/mm.h>
#include <linux/module.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "ugds_drv_uapi.h"

#ifdef UGDS_NVIDIA_P2P
#include "nv-p2p.h"
#endif

#define DRV_NAME "ugds_drv"
#define UGDS_MAX_DEVS 64
#define UGDS_MAX_VECTORS 64

/* NVMe registers used when stopping the controller. */
#define NVME_REG_CAP 0x00
#define NVME_REG_CC 0x14
#define NVME_REG_CSTS 0x1c

enum ugds_map_kind { UGDS_COHERENT, UGDS_PINNED, UGDS_DMABUF, UGDS_GPU_P2P };

struct ugds_map {
	struct list_head node;
	u64 handle;
	enum ugds_map_kind kind;
	/* coherent */
	void *cpu;
	dma_addr_t bus;
	size_t size;
	atomic_t vmas; /* user mappings of coherent memory alive */
	/* pinned */
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
	struct ugds_dev *owner;
	u64 gpu_va, gpu_len;
	struct nvidia_p2p_page_table *pt;
	struct nvidia_p2p_dma_mapping *dm;
	atomic_t revoked; /* set once: by unmap, or by the driver's free callback */
#endif
};

struct ugds_irq {
	struct eventfd_ctx *ctx;
	bool requested;
	char name[32];
};

struct ugds_dev {
	struct kref ref;
	struct pci_dev *pdev;
	void __iomem *bar0;
	resource_size_t bar0_start, bar0_len;
	struct cdev cdev;
	struct device *dev;
	int minor;
	int nvec;
	struct mutex lock; /* everything below */
	bool gone;         /* unbound: every call fails */
	bool open;
	struct list_head maps;
	u64 next_handle;
	u64 pinned_pages;
	u64 live;
	struct ugds_irq irq[UGDS_MAX_VECTORS];
};

static struct class *ugds_class;
/* Module-wide: what every open file holds (tests check these drop to zero). */
static atomic64_t ugds_total_pinned = ATOMIC64_INIT(0);
static atomic64_t ugds_total_maps = ATOMIC64_INIT(0);
static dev_t ugds_devt;
static DEFINE_IDA(ugds_ida);

static void ugds_free_dev(struct kref *ref)
{
	struct ugds_dev *d = container_of(ref, struct ugds_dev, ref);

	kfree(d);
}

/*
 * Stops the controller's DMA: disable it and wait (bounded by CAP.TO) for
 * CSTS.RDY to clear, then clear bus mastering, which stops DMA at the PCI
 * level whatever the controller does.
 */
static void ugds_stop_device(struct ugds_dev *d)
{
	u64 cap = lo_hi_readq(d->bar0 + NVME_REG_CAP);
	unsigned long timeout_ms = (((cap >> 24) & 0xff) + 1) * 500;
	unsigned long deadline = jiffies + msecs_to_jiffies(timeout_ms);
	u32 cc = readl(d->bar0 + NVME_REG_CC);

	if (cc != ~0U && (cc & 1))
		writel(cc & ~1U, d->bar0 + NVME_REG_CC);
	while (cc != ~0U && (readl(d->bar0 + NVME_REG_CSTS) & 1)) {
		if (time_after(jiffies, deadline)) {
			dev_warn(&d->pdev->dev, "controller did not become not-ready; clearing bus mastering\n");
			break;
		}
		usleep_range(1000, 2000);
	}
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

static void ugds_map_release(struct ugds_dev *d, struct ugds_map *m)
{
	struct device *dev = &d->pdev->dev;

	switch (m->kind) {
	case UGDS_COHERENT:
		dma_free_coherent(dev, m->size, m->cpu, m->bus);
		break;
	case UGDS_PINNED:
		dma_unmap_sgtable(dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
		sg_free_table(&m->sgt);
		unpin_user_pages(m->pages, m->npages);
		d->pinned_pages -= m->npages;
		atomic64_sub(m->npages, &ugds_total_pinned);
		kvfree(m->pages);
		break;
	case UGDS_GPU_P2P:
#ifdef UGDS_NVIDIA_P2P
		if (atomic_xchg(&m->revoked, 1) == 0) {
			nvidia_p2p_dma_unmap_pages(d->pdev, m->pt, m->dm);
			nvidia_p2p_put_pages(0, 0, m->gpu_va, m->pt);
		}
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
	list_del(&m->node);
	d->live--;
	atomic64_dec(&ugds_total_maps);
	kfree(m);
}

/* Everything the open file set up, after the device was stopped. */
static void ugds_teardown(struct ugds_dev *d)
{
	struct ugds_map *m, *tmp;
	unsigned int v;

	ugds_stop_device(d);
	for (v = 0; v < UGDS_MAX_VECTORS; v++)
		ugds_irq_detach(d, v);
	list_for_each_entry_safe(m, tmp, &d->maps, node)
		ugds_map_release(d, m);
}

static struct ugds_map *ugds_find(struct ugds_dev *d, u64 handle)
{
	struct ugds_map *m;

	list_for_each_entry(m, &d->maps, node)
		if (m->handle == handle)
			return m;
	return NULL;
}

static int ugds_open(struct inode *inode, struct file *f)
{
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
		kref_get(&d->ref);
		pci_set_master(d->pdev);
		f->private_data = d;
	}
	mutex_unlock(&d->lock);
	return ret;
}

static int ugds_release(struct inode *inode, struct file *f)
{
	struct ugds_dev *d = f->private_data;

	mutex_lock(&d->lock);
	if (!d->gone)
		ugds_teardown(d);
	d->open = false;
	mutex_unlock(&d->lock);
	kref_put(&d->ref, ugds_free_dev);
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
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	m->kind = UGDS_COHERENT;
	m->size = PAGE_ALIGN(req.size);
	m->cpu = dma_alloc_coherent(&d->pdev->dev, m->size, &m->bus, GFP_KERNEL);
	if (!m->cpu) {
		kfree(m);
		return -ENOMEM;
	}
	atomic_set(&m->vmas, 0);
	m->handle = ++d->next_handle;
	list_add(&m->node, &d->maps);
	d->live++;
	atomic64_inc(&ugds_total_maps);
	req.bus_addr = m->bus;
	req.mmap_offset = UGDS_DRV_MMAP_DMA_BASE + (m->handle << 32);
	req.handle = m->handle;
	if (copy_to_user(arg, &req, sizeof(req))) {
		ugds_map_release(d, m);
		return -EFAULT;
	}
	return 0;
}

/* Writes the controller address of each page of `sgt` from page `first` on
 * to the user array, `n` entries. */
static int ugds_put_pages(struct sg_table *sgt, unsigned long first, unsigned long n, u64 __user *out)
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

static long ugds_map_pinned(struct ugds_dev *d, struct ugds_drv_map *req, struct ugds_map *m)
{
	unsigned long start = req->vaddr & PAGE_MASK;
	unsigned long end;
	struct ugds_map *o;
	int pinned, ret;

	if (!req->size || req->vaddr + req->size < req->vaddr)
		return -EINVAL;
	end = PAGE_ALIGN(req->vaddr + req->size);
	if (req->npages != (end - start) >> PAGE_SHIFT)
		return -EINVAL;
	/* The ledger refuses a range that overlaps one already pinned. */
	list_for_each_entry(o, &d->maps, node)
		if (o->kind == UGDS_PINNED && start < o->end && o->start < end)
			return -EEXIST;
	m->kind = UGDS_PINNED;
	m->start = start;
	m->end = end;
	m->npages = req->npages;
	m->pages = kvmalloc_array(m->npages, sizeof(*m->pages), GFP_KERNEL);
	if (!m->pages)
		return -ENOMEM;
	pinned = pin_user_pages_fast(start, m->npages, FOLL_WRITE | FOLL_LONGTERM, m->pages);
	if (pinned != m->npages) {
		if (pinned > 0)
			unpin_user_pages(m->pages, pinned);
		kvfree(m->pages);
		return pinned < 0 ? pinned : -EFAULT;
	}
	ret = sg_alloc_table_from_pages(&m->sgt, m->pages, m->npages, 0, m->npages << PAGE_SHIFT, GFP_KERNEL);
	if (ret)
		goto unpin;
	ret = dma_map_sgtable(&d->pdev->dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
	if (ret)
		goto free_sgt;
	ret = ugds_put_pages(&m->sgt, 0, m->npages, u64_to_user_ptr(req->pages_ptr));
	if (ret)
		goto unmap;
	d->pinned_pages += m->npages;
	atomic64_add(m->npages, &ugds_total_pinned);
	return 0;
unmap:
	dma_unmap_sgtable(&d->pdev->dev, &m->sgt, DMA_BIDIRECTIONAL, 0);
free_sgt:
	sg_free_table(&m->sgt);
unpin:
	unpin_user_pages(m->pages, m->npages);
	kvfree(m->pages);
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
	pr_warn_ratelimited("ugds_drv: exporter asked to move a pinned dma-buf; kept until unmapped\n");
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
	if (!req->size || req->offset + req->size < req->offset || req->offset + req->size > m->dbuf->size) {
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
 * The NVIDIA driver frees the pages under a live mapping (the process freed
 * the memory, or exited). The controller might still DMA into them: stop it
 * first (bus mastering off; the user-space engine sees its commands time out
 * and the handle wedge), then release what the driver handed us, as its API
 * requires from this callback.
 */
static void ugds_p2p_free(void *data)
{
	struct ugds_map *m = data;

	if (atomic_xchg(&m->revoked, 1))
		return;
	pci_clear_master(m->owner->pdev);
	dev_warn(&m->owner->pdev->dev, "GPU memory %llx+%llx freed while mapped: bus mastering stopped\n",
		 m->gpu_va, m->gpu_len);
	nvidia_p2p_free_dma_mapping(m->dm);
	nvidia_p2p_free_page_table(m->pt);
}

static long ugds_map_nvidia_p2p(struct ugds_dev *d, struct ugds_drv_map *req, struct ugds_map *m)
{
	const u64 gran = 64 * 1024;
	u64 done = 0, i, off;
	int ret;

	if (!req->size || (req->vaddr | req->size) & (gran - 1) || req->vaddr + req->size < req->vaddr ||
	    req->npages != req->size >> PAGE_SHIFT)
		return -EINVAL;
	m->owner = d;
	m->gpu_va = req->vaddr;
	m->gpu_len = req->size;
	atomic_set(&m->revoked, 0);
	ret = nvidia_p2p_get_pages(0, 0, req->vaddr, req->size, &m->pt, ugds_p2p_free, m);
	if (ret)
		return ret;
	ret = nvidia_p2p_dma_map_pages(d->pdev, m->pt, &m->dm);
	if (ret)
		goto put;
	if (m->dm->page_size_type != NVIDIA_P2P_PAGE_SIZE_64KB) {
		ret = -EOPNOTSUPP;
		goto unmap;
	}
	/* Each 64 KiB GPU page becomes sixteen controller pages. */
	for (i = 0; i < m->dm->entries && done < req->npages; i++)
		for (off = 0; off < gran && done < req->npages; off += PAGE_SIZE, done++)
			if (put_user(m->dm->dma_addresses[i] + off, (u64 __user *)u64_to_user_ptr(req->pages_ptr) + done)) {
				ret = -EFAULT;
				goto unmap;
			}
	if (done != req->npages) {
		ret = -EINVAL;
		goto unmap;
	}
	m->kind = UGDS_GPU_P2P;
	return 0;
unmap:
	nvidia_p2p_dma_unmap_pages(d->pdev, m->pt, m->dm);
put:
	atomic_set(&m->revoked, 1);
	nvidia_p2p_put_pages(0, 0, req->vaddr, m->pt);
	return ret;
}
#endif

static long ugds_map(struct ugds_dev *d, void __user *arg)
{
	struct ugds_drv_map req;
	struct ugds_map *m;
	long ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.npages == 0 || req.npages > (1UL << 24) || (req.flags & ~UGDS_DRV_MAP_NVIDIA_P2P))
		return -EINVAL;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return -ENOMEM;
	if (req.flags & UGDS_DRV_MAP_NVIDIA_P2P) {
#ifdef UGDS_NVIDIA_P2P
		ret = req.dmabuf_fd >= 0 ? -EINVAL : ugds_map_nvidia_p2p(d, &req, m);
#else
		ret = -EOPNOTSUPP;
#endif
	} else {
		ret = req.dmabuf_fd >= 0 ? ugds_map_dmabuf(d, &req, m) : ugds_map_pinned(d, &req, m);
	}
	if (ret) {
		kfree(m);
		return ret;
	}
	m->handle = ++d->next_handle;
	list_add(&m->node, &d->maps);
	d->live++;
	atomic64_inc(&ugds_total_maps);
	req.handle = m->handle;
	if (copy_to_user(arg, &req, sizeof(req))) {
		ugds_map_release(d, m);
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

static long ugds_set_irq(struct ugds_dev *d, void __user *arg)
{
	struct ugds_drv_irq req;
	struct eventfd_ctx *ctx;
	int ret;

	if (copy_from_user(&req, arg, sizeof(req)))
		return -EFAULT;
	if (req.vector >= d->nvec)
		return -EINVAL;
	ugds_irq_detach(d, req.vector);
	if (req.eventfd < 0)
		return 0;
	ctx = eventfd_ctx_fdget(req.eventfd);
	if (IS_ERR(ctx))
		return PTR_ERR(ctx);
	d->irq[req.vector].ctx = ctx;
	snprintf(d->irq[req.vector].name, sizeof(d->irq[req.vector].name), "ugds_drv%d-q%u", d->minor, req.vector);
	ret = request_irq(pci_irq_vector(d->pdev, req.vector), ugds_irq_handler, 0, d->irq[req.vector].name,
			  &d->irq[req.vector]);
	if (ret) {
		eventfd_ctx_put(ctx);
		d->irq[req.vector].ctx = NULL;
		return ret;
	}
	d->irq[req.vector].requested = true;
	return 0;
}

static long ugds_ioctl(struct file *f, unsigned int cmd, unsigned long arg)
{
	struct ugds_dev *d = f->private_data;
	void __user *uarg = (void __user *)arg;
	struct ugds_map *m;
	u64 handle;
	long ret;

	mutex_lock(&d->lock);
	if (d->gone) {
		ret = -ENODEV;
		goto out;
	}
	switch (cmd) {
	case UGDS_DRV_IOC_INFO: {
		struct ugds_drv_info info = {
			.abi_version = UGDS_DRV_ABI_VERSION,
			.msix_vectors = d->nvec,
			.bar0_size = d->bar0_len,
			.pinned_pages = d->pinned_pages,
			.live_mappings = d->live,
			.total_pinned_pages = atomic64_read(&ugds_total_pinned),
			.total_mappings = atomic64_read(&ugds_total_maps),
		};
		ret = copy_to_user(uarg, &info, sizeof(info)) ? -EFAULT : 0;
		break;
	}
	case UGDS_DRV_IOC_ALLOC_DMA:
		ret = ugds_alloc_dma(d, uarg);
		break;
	case UGDS_DRV_IOC_MAP:
		ret = ugds_map(d, uarg);
		break;
	case UGDS_DRV_IOC_FREE_DMA:
	case UGDS_DRV_IOC_UNMAP:
		ret = -EINVAL;
		if (get_user(handle, (u64 __user *)uarg)) {
			ret = -EFAULT;
			break;
		}
		m = ugds_find(d, handle);
		if (!m)
			break; /* stale or unknown handle */
		if ((cmd == UGDS_DRV_IOC_FREE_DMA) != (m->kind == UGDS_COHERENT))
			break;
		if (m->kind == UGDS_COHERENT && atomic_read(&m->vmas)) {
			ret = -EBUSY; /* still mapped in the process */
			break;
		}
		ugds_map_release(d, m);
		ret = 0;
		break;
	case UGDS_DRV_IOC_SET_IRQ:
		ret = ugds_set_irq(d, uarg);
		break;
	default:
		ret = -ENOTTY;
	}
out:
	mutex_unlock(&d->lock);
	return ret;
}

static void ugds_vma_open(struct vm_area_struct *vma)
{
	struct ugds_map *m = vma->vm_private_data;

	atomic_inc(&m->vmas);
}

static void ugds_vma_close(struct vm_area_struct *vma)
{
	struct ugds_map *m = vma->vm_private_data;

	atomic_dec(&m->vmas);
}

static const struct vm_operations_struct ugds_dma_vm_ops = {
	.open = ugds_vma_open,
	.close = ugds_vma_close,
};

static int ugds_mmap(struct file *f, struct vm_area_struct *vma)
{
	struct ugds_dev *d = f->private_data;
	u64 off = (u64)vma->vm_pgoff << PAGE_SHIFT;
	unsigned long len = vma->vm_end - vma->vm_start;
	struct ugds_map *m;
	int ret = -EINVAL;

	mutex_lock(&d->lock);
	if (d->gone) {
		ret = -ENODEV;
		goto out;
	}
	if (off == 0) {
		/* BAR0, uncached. */
		if (len > PAGE_ALIGN(d->bar0_len))
			goto out;
		vma->vm_page_prot = pgprot_noncached(vma->vm_page_prot);
		vm_flags_set(vma, VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP);
		ret = io_remap_pfn_range(vma, vma->vm_start, d->bar0_start >> PAGE_SHIFT, len, vma->vm_page_prot);
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
		atomic_inc(&m->vmas);
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
	.mmap = ugds_mmap,
};

static int ugds_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct ugds_dev *d;
	int ret;

	if ((pdev->class >> 8) != 0x0108 || (pdev->class & 0xff) != 0x02)
		return -ENODEV; /* NVMe functions only */
	d = kzalloc(sizeof(*d), GFP_KERNEL);
	if (!d)
		return -ENOMEM;
	kref_init(&d->ref);
	mutex_init(&d->lock);
	INIT_LIST_HEAD(&d->maps);
	d->pdev = pdev;
	ret = pci_enable_device_mem(pdev);
	if (ret)
		goto free;
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
	d->minor = ida_alloc_max(&ugds_ida, UGDS_MAX_DEVS - 1, GFP_KERNEL);
	if (d->minor < 0) {
		ret = d->minor;
		goto vectors;
	}
	cdev_init(&d->cdev, &ugds_fops);
	d->cdev.owner = THIS_MODULE;
	ret = cdev_add(&d->cdev, MKDEV(MAJOR(ugds_devt), d->minor), 1);
	if (ret)
		goto minor;
	d->dev = device_create(ugds_class, &pdev->dev, MKDEV(MAJOR(ugds_devt), d->minor), d, "ugds_drv%d", d->minor);
	if (IS_ERR(d->dev)) {
		ret = PTR_ERR(d->dev);
		goto cdev;
	}
	pci_set_drvdata(pdev, d);
	dev_info(&pdev->dev, "ugds_drv%d: BAR0 %pa+%llu, %d MSI-X vectors\n", d->minor, &d->bar0_start,
		 (unsigned long long)d->bar0_len, d->nvec);
	return 0;
cdev:
	cdev_del(&d->cdev);
minor:
	ida_free(&ugds_ida, d->minor);
vectors:
	if (d->nvec > 0)
		pci_free_irq_vectors(pdev);
	pci_iounmap(pdev, d->bar0);
release:
	pci_release_mem_regions(pdev);
disable:
	pci_disable_device(pdev);
free:
	kfree(d);
	return ret;
}

static void ugds_remove(struct pci_dev *pdev)
{
	struct ugds_dev *d = pci_get_drvdata(pdev);

	device_destroy(ugds_class, MKDEV(MAJOR(ugds_devt), d->minor));
	cdev_del(&d->cdev);
	mutex_lock(&d->lock);
	/* Unbound while open: stop the device and release everything now;
	 * the open file only gets -ENODEV from here on. */
	if (d->open)
		ugds_teardown(d);
	else
		pci_clear_master(pdev);
	d->gone = true;
	mutex_unlock(&d->lock);
	ida_free(&ugds_ida, d->minor);
	if (d->nvec > 0)
		pci_free_irq_vectors(pdev);
	pci_iounmap(pdev, d->bar0);
	pci_release_mem_regions(pdev);
	pci_disable_device(pdev);
	kref_put(&d->ref, ugds_free_dev);
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
	class_destroy(ugds_class);
	unregister_chrdev_region(ugds_devt, UGDS_MAX_DEVS);
}

module_init(ugds_init);
module_exit(ugds_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("ugds kernel helper: BAR, DMA and interrupt set-up for user-space NVMe");
MODULE_IMPORT_NS(DMA_BUF);
