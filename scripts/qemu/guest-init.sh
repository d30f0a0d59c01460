#!/bin/sh
# /init of the conformance guest: bind the NVMe function to vfio-pci and run
# ugds's conformance tests and `ugds bench --verify` against it.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m || echo "UGDS-GUEST: insmod $m failed"; done
sleep 1
echo "UGDS-GUEST: kernel $(uname -r), NVMe at $BDF"
driver() { basename "$(readlink /sys/bus/pci/devices/$BDF/driver)"; }
# Binding refuses a function whose namespace is mounted, and leaves it be.
NS=$(ls /sys/block | grep -m1 '^nvme[0-9]*n[0-9]*$')
mkdir -p /mnt
mke2fs -q -b 4096 /dev/$NS && mount -t ext2 /dev/$NS /mnt || echo "UGDS-GUEST: could not mount /dev/$NS"
run list /bin/ugds list
refuse_check() {
    out=$(/bin/ugds bind $BDF vfio-pci 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "is mounted on /mnt" && [ "$(driver)" = nvme ]
}
run bind-refuses-mounted refuse_check
# `ugds doctor` sees the mount: the kernel path only, and says why.
doctor_mounted() {
    out=$(/bin/ugds doctor 2>&1); echo "$out"
    echo "$out" | grep -q "^nvme $BDF .*driver nvme" &&
        echo "$out" | grep -q "^  user    no: its namespaces are in use (/dev/$NS is mounted on /mnt)" &&
        echo "$out" | grep -q "^  kernel  yes: io_uring on /dev/$NS" &&
        echo "$out" | grep -q "^iommu        on" &&
        ! /bin/ugds doctor --mode user > /dev/null && /bin/ugds doctor --mode kernel > /dev/null
}
run doctor-mounted doctor_mounted
umount /mnt
# A file system mounted in another mount namespace (invisible in ours): the
# kernel refuses an exclusive open, and --force does not override that.
other_ns_check() {
    unshare -m sh -c "mount -t ext2 /dev/$NS /mnt && sleep 20" &
    pid=$!
    sleep 2
    out=$(/bin/ugds bind $BDF vfio-pci --force 2>&1); rc=$?
    kill $pid; sleep 1
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "the kernel holds /dev/$NS" && [ "$(driver)" = nvme ]
}
run bind-refuses-other-namespace other_ns_check
# A process with the raw namespace open (a VM, say): refused unless --force.
opener_check() {
    sleep 20 < /dev/$NS &
    pid=$!
    sleep 1
    out=$(/bin/ugds bind $BDF vfio-pci 2>&1); rc=$?
    kill $pid; sleep 1
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "is open in process $pid" && [ "$(driver)" = nvme ]
}
run bind-refuses-an-opener opener_check
# Swap on the namespace: the kernel claims it, --force or not.
swap_check() {
    mkswap /dev/$NS > /dev/null && swapon /dev/$NS || return 1
    out=$(/bin/ugds bind $BDF vfio-pci --force 2>&1); rc=$?
    swapoff /dev/$NS
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "used as swap" && [ "$(driver)" = nvme ]
}
run bind-refuses-swap swap_check
# A loop device backed by the namespace (not an exclusive claim): refused
# unless --force.
loop_check() {
    losetup /dev/loop0 /dev/$NS || return 1
    out=$(/bin/ugds bind $BDF vfio-pci 2>&1); rc=$?
    losetup -d /dev/loop0
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "/dev/$NS backs /dev/loop0" && [ "$(driver)" = nvme ]
}
run bind-refuses-a-loop-device loop_check
# Kernel users by technology, each set up for real. btrfs (its mount shows
# an anonymous device number, not the namespace), an XFS external log and a
# LIO iblock backstore: the kernel holds the namespace, --force or not. An
# nvmet export (which opens it shared): refused unless --force. (ZFS is not
# in Debian's kernel.)
mount -t configfs none /sys/kernel/config
btrfs_check() {
    mkfs.btrfs -f -q -M /dev/$NS && mount -t btrfs /dev/$NS /mnt || return 1
    out=$(/bin/ugds bind $BDF vfio-pci --force 2>&1); rc=$?
    umount /mnt
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "the kernel holds /dev/$NS" && [ "$(driver)" = nvme ]
}
run bind-refuses-btrfs btrfs_check
xfs_log_check() {
    truncate -s 320M /tmp/xfs.img && losetup /dev/loop1 /tmp/xfs.img || return 1
    if ! { mkfs.xfs -f -q -s size=4096 -l logdev=/dev/$NS,size=64m /dev/loop1 && mount -t xfs -o logdev=/dev/$NS /dev/loop1 /mnt; }; then
        losetup -d /dev/loop1; rm -f /tmp/xfs.img; return 1
    fi
    out=$(/bin/ugds bind $BDF vfio-pci --force 2>&1); rc=$?
    umount /mnt; losetup -d /dev/loop1; rm -f /tmp/xfs.img
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "the kernel holds /dev/$NS" && [ "$(driver)" = nvme ]
}
run bind-refuses-an-xfs-log xfs_log_check
nvmet_check() {
    S=/sys/kernel/config/nvmet/subsystems/ugds-test
    mkdir -p $S/namespaces/1 && echo -n /dev/$NS > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable \
        || return 1
    out=$(/bin/ugds bind $BDF vfio-pci 2>&1); rc=$?
    echo 0 > $S/namespaces/1/enable; rmdir $S/namespaces/1; rmdir $S
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "is exported by nvmet" && [ "$(driver)" = nvme ]
}
run bind-refuses-nvmet nvmet_check
lio_check() {
    H=/sys/kernel/config/target/core/iblock_0
    mkdir -p $H/ugds && echo "udev_path=/dev/$NS" > $H/ugds/control && echo 1 > $H/ugds/enable || return 1
    out=$(/bin/ugds bind $BDF vfio-pci --force 2>&1); rc=$?
    rmdir $H/ugds; rmdir $H
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "the kernel holds /dev/$NS" && [ "$(driver)" = nvme ]
}
run bind-refuses-lio lio_check
# The kernel path on the namespace while the kernel keeps it (nvme bound):
# the conformance suite on its block device (io_uring, O_DIRECT), then on its
# generic character device (NVMe commands passed through io_uring), polled
# and with interrupts.
NG=$(echo $NS | sed 's/^nvme/ng/')
echo "UGDS-GUEST: kernel path on /dev/$NS and /dev/$NG (requests up to $(cat /sys/block/$NS/queue/max_hw_sectors_kb) KiB, $(cat /sys/block/$NS/queue/max_segments) segments)"
export RUST_BACKTRACE=1
UGDS_TEST_KERNEL_DEV=/dev/$NS run kernel-path-block /bin/conformance --test-threads=1
# Passthrough bypasses the block device's page cache: pages written there
# and not yet on the disk are written back when a passthrough handle opens,
# not over its writes later. Descriptor 3 keeps dd's close from writing
# them back itself (as a process's io_uring ring, torn down after it exits,
# kept /dev/$NS open while its last buffered writes went to the disk over
# the next process's passthrough writes). The test's handles write 128 KiB
# at 2 MiB (blocks 512-543); once the last close has written back whatever
# was still dirty, none of those blocks may hold dd's zeros.
cache_check() {
    exec 3</dev/$NS
    dd if=/dev/zero of=/dev/$NS bs=4096 seek=512 count=32 conv=notrunc 2>/dev/null
    UGDS_TEST_KERNEL_DEV=/dev/$NG /bin/conformance --test-threads=1 --exact fresh_handles_write_what_they_are_given; rc=$?
    exec 3<&-
    zeros=0 k=512
    while [ $k -lt 544 ]; do
        [ "$(dd if=/dev/$NS bs=4096 skip=$k count=1 2>/dev/null | tr -d '\000' | wc -c)" -eq 0 ] && zeros=$((zeros + 1))
        k=$((k + 1))
    done
    echo "blocks holding the page cache's zeros after the handles' writes: $zeros of 32"
    [ $rc -eq 0 ] && [ $zeros -eq 0 ]
}
run passthrough-after-page-cache cache_check
UGDS_TEST_KERNEL_DEV=/dev/$NG run kernel-path-passthrough /bin/conformance --test-threads=1
UGDS_TEST_KERNEL_DEV=/dev/$NG UGDS_TEST_INTERRUPT=1 run kernel-path-passthrough-irq /bin/conformance --test-threads=1
unset UGDS_TEST_KERNEL_DEV UGDS_TEST_INTERRUPT
run bind-vfio /bin/ugds bind $BDF vfio-pci
echo "UGDS-GUEST: driver $(driver)"
# Bound to vfio-pci: doctor says the user-space driver is ready (exit 0).
doctor_vfio() {
    out=$(/bin/ugds doctor --json 2>&1); echo "$out"
    echo "$out" | grep -q "\"driver\": \"vfio-pci\"" &&
        echo "$out" | grep -q "ugds bench --pci $BDF" &&
        /bin/ugds doctor --mode user > /dev/null && ! /bin/ugds doctor --mode p2p > /dev/null
}
run doctor-vfio doctor_vfio
export UGDS_TEST_PCI=$BDF RUST_BACKTRACE=1
run conformance-poll /bin/conformance --test-threads=1
UGDS_TEST_INTERRUPT=1 run conformance-irq /bin/conformance --test-threads=1
run bench-verify /bin/ugds bench --pci $BDF --verify -d 1 -q 4 --range 16M --no-progress
run bench-verify-irq /bin/ugds bench --pci $BDF --verify -d 1 -q 4 --range 16M --interrupt --no-progress
run bench-batch-verify /bin/ugds bench --pci $BDF --verify -d 1 --batch 16 -m randwrite --range 16M --no-progress
run identify /bin/ugds identify --pci $BDF
# Several processes on the controller through vfio-pci (the default
# configuration only: the step takes about half a minute under TCG).
[ "$CONFIG" = default ] && run serve-vfio serve_check --pci $BDF

# The same controller through our kernel module.
insmod /bin/ugds_drv.ko || echo "UGDS-GUEST: insmod ugds_drv failed"
run bind-ugds_drv /bin/ugds bind $BDF ugds_drv
doctor_drv() {
    out=$(/bin/ugds doctor 2>&1); echo "$out"
    echo "$out" | grep -q "^ugds_drv     loaded, version 2\." && echo "$out" | grep -q "^nvme $BDF .*driver ugds_drv"
}
run doctor-drv doctor_drv
echo "UGDS-GUEST: driver $(driver), $(ls /dev/ugds_drv*)"
DRV=/dev/ugds_drv0
unset UGDS_TEST_PCI
drv_steps $DRV
echo "UGDS-GUEST: driver after the lifecycle step: $(driver)"
echo "UGDS-GUEST: done"
poweroff -f
