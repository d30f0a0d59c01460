// SPDX-License-Identifier: GPL-2.0
/*
 * nv_p2p_fake: a stand-in for the NVIDIA driver's nvidia_p2p_* interface,
 * for testing ugds_drv's GPU-memory path in a QEMU guest without a GPU.
 * Built against NVIDIA's nv-p2p.h; never loaded outside tests.
 *
 * "GPU memory" is host memory, 64 KiB chunks per range, mapped for the peer
 * with the DMA API, so the emulated NVMe controller really reaches it. It
 * behaves as the NVIDIA driver does where ugds_drv depends on it:
 *
 * - get_pages_persistent succeeds only with persistent=1 (as on GPUs and
 *   configurations that offer it); get_pages takes a free callback.
 * - Taking a range back (debugfs `revoke`, standing in for cudaFree or the
 *   process exiting) unlinks it, calls the free callback with `lock` held
 *   (the NVIDIA driver holds its own locks there), then frees it, DMA
 *   mapping included. put_pages takes the same lock, so lockdep sees any
 *   lock a client holds across put_pages that its callback also takes.
 * - put_pages on a range already unlinked returns 0; free_page_table and
 *   free_dma_mapping do nothing (the driver frees after the callback).
 *
 * debugfs (nv_p2p_fake/): `revoke` (write a range's address), `ranges`
 * (read: ranges alive), `fill` (write "ADDR BYTE": set a range's bytes),
 * `sum` (write a range's address, then read the byte sum of its memory).
 */
#include <linux/debugfs.h>
#include <linux/dma-mapping.h>
#include <linux/kernel.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/pci.h>
#include <linux/slab.h>
#include <linux/uaccess.h>

#include "nv-p2p.h"

#define CHUNK (64 * 1024)

static bool persistent;
module_param(persistent, bool, 0644);
MODULE_PARM_DESC(persistent, "offer nvidia_p2p_get_pages_persistent (default: no)");

struct fake_range {
	struct list_head node;
	u64 va, len;
	bool persistent;
	void (*cb)(void *data);
	void *data;
	struct nvidia_p2p_page_table pt;
	struct page **chunks;
	struct nvidia_p2p_dma_mapping *dm; /* at most one */
	struct pci_dev *peer;
};

static DEFINE_MUTEX(lock);
static LIST_HEAD(ranges);
static struct dentry *dir;
static u64 sum_va;

static void fake_unmap(struct fake_range *r)
{
	u32 i;

	if (!r->dm)
		return;
	for (i = 0; i < r->dm->entries; i++)
		dma_unmap_page(&r->peer->dev, r->dm->dma_addresses[i], CHUNK, DMA_BIDIRECTIONAL);
	kfree(r->dm->dma_addresses);
	kfree(r->dm);
	r->dm = NULL;
	pci_dev_put(r->peer);
	r->peer = NULL;
}

static void fake_free(struct fake_range *r)
{
	u32 i;

	fake_unmap(r);
	for (i = 0; i < r->pt.entries; i++) {
		__free_pages(r->chunks[i], get_order(CHUNK));
		kfree(r->pt.pages[i]);
	}
	kfree(r->pt.pages);
	kfree(r->pt.gpu_uuid);
	kfree(r->chunks);
	kfree(r);
}

/* The range whose page table is `pt`, if still linked (lock held). */
static struct fake_range *fake_find(struct nvidia_p2p_page_table *pt)
{
	struct fake_range *r;

	list_for_each_entry(r, &ranges, node)
		if (&r->pt == pt)
			return r;
	return NULL;
}

static int fake_get(u64 va, u64 len, struct nvidia_p2p_page_table **page_table,
		    void (*cb)(void *data), void *data, bool pers)
{
	struct fake_range *r;
	u32 i, n;

	if (!len || (va | len) & (CHUNK - 1))
		return -EINVAL;
	n = len / CHUNK;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	r->va = va;
	r->len = len;
	r->persistent = pers;
	r->cb = cb;
	r->data = data;
	r->chunks = kcalloc(n, sizeof(*r->chunks), GFP_KERNEL);
	r->pt.pages = kcalloc(n, sizeof(*r->pt.pages), GFP_KERNEL);
	r->pt.gpu_uuid = kzalloc(NVIDIA_P2P_GPU_UUID_LEN, GFP_KERNEL);
	if (!r->chunks || !r->pt.pages || !r->pt.gpu_uuid)
		goto nomem;
	r->pt.version = NVIDIA_P2P_PAGE_TABLE_VERSION;
	r->pt.page_size = NVIDIA_P2P_PAGE_SIZE_64KB;
	for (i = 0; i < n; i++) {
		r->chunks[i] = alloc_pages(GFP_KERNEL | __GFP_ZERO, get_order(CHUNK));
		r->pt.pages[i] = kzalloc(sizeof(*r->pt.pages[i]), GFP_KERNEL);
		if (!r->chunks[i] || !r->pt.pages[i]) {
			if (r->chunks[i])
				__free_pages(r->chunks[i], get_order(CHUNK));
			kfree(r->pt.pages[i]);
			goto nomem;
		}
		r->pt.pages[i]->physical_address = page_to_phys(r->chunks[i]);
		r->pt.entries++;
	}
	mutex_lock(&lock);
	list_add(&r->node, &ranges);
	mutex_unlock(&lock);
	*page_table = &r->pt;
	return 0;
nomem:
	fake_free(r);
	return -ENOMEM;
}

int nvidia_p2p_get_pages(u64 p2p_token, u32 va_space, u64 virtual_address, u64 length,
			 struct nvidia_p2p_page_table **page_table,
			 void (*free_callback)(void *data), void *data)
{
	if (!free_callback)
		return -EINVAL;
	return fake_get(virtual_address, length, page_table, free_callback, data, false);
}
EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages);

int nvidia_p2p_get_pages_persistent(u64 virtual_address, u64 length,
				    struct nvidia_p2p_page_table **page_table, u32 flags)
{
	if (!persistent)
		return -ENOTSUPP;
	return fake_get(virtual_address, length, page_table, NULL, NULL, true);
}
EXPORT_SYMBOL_GPL(nvidia_p2p_get_pages_persistent);

static int fake_put(struct nvidia_p2p_page_table *page_table)
{
	struct fake_range *r;

	mutex_lock(&lock);
	r = fake_find(page_table);
	if (r)
		list_del(&r->node);
	mutex_unlock(&lock);
	if (r)
		fake_free(r);
	return 0;
}

int nvidia_p2p_put_pages(u64 p2p_token, u32 va_space, u64 virtual_address,
			 struct nvidia_p2p_page_table *page_table)
{
	return fake_put(page_table);
}
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages);

int nvidia_p2p_put_pages_persistent(u64 virtual_address, struct nvidia_p2p_page_table *page_table,
				    u32 flags)
{
	return fake_put(page_table);
}
EXPORT_SYMBOL_GPL(nvidia_p2p_put_pages_persistent);

int nvidia_p2p_dma_map_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			     struct nvidia_p2p_dma_mapping **dma_mapping)
{
	struct nvidia_p2p_dma_mapping *dm;
	struct fake_range *r;
	int ret = 0;
	u32 i;

	dm = kzalloc(sizeof(*dm), GFP_KERNEL);
	if (!dm)
		return -ENOMEM;
	mutex_lock(&lock);
	r = fake_find(page_table);
	if (!r || r->dm) {
		ret = -EINVAL;
		goto out;
	}
	dm->dma_addresses = kcalloc(r->pt.entries, sizeof(u64), GFP_KERNEL);
	if (!dm->dma_addresses) {
		ret = -ENOMEM;
		goto out;
	}
	for (i = 0; i < r->pt.entries; i++) {
		dma_addr_t a;

		a = dma_map_page(&peer->dev, r->chunks[i], 0, CHUNK, DMA_BIDIRECTIONAL);
		if (dma_mapping_error(&peer->dev, a)) {
			while (i--)
				dma_unmap_page(&peer->dev, dm->dma_addresses[i], CHUNK,
					       DMA_BIDIRECTIONAL);
			kfree(dm->dma_addresses);
			ret = -EIO;
			goto out;
		}
		dm->dma_addresses[i] = a;
	}
	dm->version = NVIDIA_P2P_DMA_MAPPING_VERSION;
	dm->page_size_type = NVIDIA_P2P_PAGE_SIZE_64KB;
	dm->entries = r->pt.entries;
	dm->pci_dev = peer;
	r->peer = pci_dev_get(peer);
	r->dm = dm;
	*dma_mapping = dm;
out:
	mutex_unlock(&lock);
	if (ret)
		kfree(dm);
	return ret;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_map_pages);

int nvidia_p2p_dma_unmap_pages(struct pci_dev *peer, struct nvidia_p2p_page_table *page_table,
			       struct nvidia_p2p_dma_mapping *dma_mapping)
{
	struct fake_range *r;

	mutex_lock(&lock);
	r = fake_find(page_table);
	if (r && r->dm == dma_mapping)
		fake_unmap(r);
	mutex_unlock(&lock);
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_dma_unmap_pages);

int nvidia_p2p_free_page_table(struct nvidia_p2p_page_table *page_table)
{
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_free_page_table);

int nvidia_p2p_free_dma_mapping(struct nvidia_p2p_dma_mapping *dma_mapping)
{
	return 0;
}
EXPORT_SYMBOL_GPL(nvidia_p2p_free_dma_mapping);

static u64 parse_u64(const char __user *buf, size_t len, u64 *second)
{
	char s[64];
	u64 v = 0;

	if (len >= sizeof(s) || copy_from_user(s, buf, len))
		return 0;
	s[len] = 0;
	if (second) {
		unsigned long long a, b;

		if (sscanf(s, "%llx %llx", &a, &b) != 2)
			return 0;
		*second = b;
		return a;
	}
	if (kstrtou64(strim(s), 0, &v))
		return 0;
	return v;
}

/* Takes a non-persistent range back, as the NVIDIA driver does. */
static ssize_t revoke_write(struct file *f, const char __user *buf, size_t len, loff_t *pos)
{
	u64 va = parse_u64(buf, len, NULL);
	struct fake_range *r, *hit = NULL;

	mutex_lock(&lock);
	list_for_each_entry(r, &ranges, node)
		if (!r->persistent && r->va == va) {
			hit = r;
			break;
		}
	if (hit) {
		list_del(&hit->node);
		hit->cb(hit->data);
	}
	mutex_unlock(&lock);
	if (!hit)
		return -ENOENT;
	fake_free(hit);
	return len;
}

static ssize_t ranges_read(struct file *f, char __user *buf, size_t len, loff_t *pos)
{
	struct fake_range *r;
	char s[24];
	int n = 0;

	mutex_lock(&lock);
	list_for_each_entry(r, &ranges, node)
		n++;
	mutex_unlock(&lock);
	return simple_read_from_buffer(buf, len, pos, s, scnprintf(s, sizeof(s), "%d\n", n));
}

static struct fake_range *fake_by_va(u64 va)
{
	struct fake_range *r;

	list_for_each_entry(r, &ranges, node)
		if (r->va == va)
			return r;
	return NULL;
}

static ssize_t fill_write(struct file *f, const char __user *buf, size_t len, loff_t *pos)
{
	u64 byte = 0, va = parse_u64(buf, len, &byte);
	struct fake_range *r;
	u32 i;

	mutex_lock(&lock);
	r = fake_by_va(va);
	for (i = 0; r && i < r->pt.entries; i++)
		memset(page_address(r->chunks[i]), (int)byte, CHUNK);
	mutex_unlock(&lock);
	return r ? len : -ENOENT;
}

static ssize_t sum_write(struct file *f, const char __user *buf, size_t len, loff_t *pos)
{
	sum_va = parse_u64(buf, len, NULL);
	return len;
}

static ssize_t sum_read(struct file *f, char __user *buf, size_t len, loff_t *pos)
{
	struct fake_range *r;
	u64 sum = 0;
	char s[24];
	u32 i, j;

	mutex_lock(&lock);
	r = fake_by_va(sum_va);
	for (i = 0; r && i < r->pt.entries; i++) {
		const u8 *p = page_address(r->chunks[i]);

		for (j = 0; j < CHUNK; j++)
			sum += p[j];
	}
	mutex_unlock(&lock);
	if (!r)
		return -ENOENT;
	return simple_read_from_buffer(buf, len, pos, s, scnprintf(s, sizeof(s), "%llu\n", sum));
}

static const struct file_operations revoke_fops = { .owner = THIS_MODULE, .write = revoke_write };
static const struct file_operations ranges_fops = { .owner = THIS_MODULE, .read = ranges_read };
static const struct file_operations fill_fops = { .owner = THIS_MODULE, .write = fill_write };
static const struct file_operations sum_fops = {
	.owner = THIS_MODULE, .write = sum_write, .read = sum_read
};

static int __init fake_init(void)
{
	dir = debugfs_create_dir("nv_p2p_fake", NULL);
	debugfs_create_file("revoke", 0200, dir, NULL, &revoke_fops);
	debugfs_create_file("ranges", 0400, dir, NULL, &ranges_fops);
	debugfs_create_file("fill", 0200, dir, NULL, &fill_fops);
	debugfs_create_file("sum", 0600, dir, NULL, &sum_fops);
	return 0;
}

static void __exit fake_exit(void)
{
	struct fake_range *r, *tmp;

	debugfs_remove_recursive(dir);
	/* A client module using these symbols is unloaded first. */
	list_for_each_entry_safe(r, tmp, &ranges, node) {
		list_del(&r->node);
		fake_free(r);
	}
}

module_init(fake_init);
module_exit(fake_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("test stand-in for the NVIDIA driver's nvidia_p2p interface");
