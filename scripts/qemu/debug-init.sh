#!/bin/sh
# /init of the debug configuration's guest: the debug kernel (KASAN, lockdep,
# sleeping in atomic context, DMA-API debugging, kmemleak; everything built in
# but ugds_drv). Every ugds_drv step of the default guest, then load/unload
# cycles and a kmemleak scan. The harness fails the run on any report of
# those checkers in the console.
. /bin/guest-lib.sh
mount -t debugfs none /sys/kernel/debug
# Whatever boot left for kmemleak is not ours: scan, then forget it.
echo scan > /sys/kernel/debug/kmemleak; echo clear > /sys/kernel/debug/kmemleak
echo "UGDS-GUEST: kernel $(uname -r), NVMe at $BDF"
driver() { basename "$(readlink /sys/bus/pci/devices/$BDF/driver)"; }
insmod /bin/ugds_drv.ko || echo "UGDS-GUEST: insmod ugds_drv failed"
run bind-ugds_drv /bin/ugds bind $BDF ugds_drv
DRV=/dev/ugds_drv0
drv_steps $DRV
# GPU memory through nvidia_p2p, against nv_p2p_fake (kmod/test), the NVIDIA
# driver's stand-in, with ugds_drv built against it: the free callback
# racing UNMAP and MAP and stopping the controller, then persistent pages.
# Both modules unload afterwards (nothing holds them), and the plain
# ugds_drv comes back.
p2p() {
    echo "$BDF" > /sys/bus/pci/drivers/ugds_drv/unbind && rmmod ugds_drv || return 1
    insmod /bin/nv_p2p_fake.ko persistent="$1" && insmod /bin/ugds_drv_p2p.ko || return 1
    echo "$BDF" > /sys/bus/pci/drivers_probe
    [ "$(driver)" = ugds_drv ] || return 1
    UGDS_TEST_NV_P2P=/sys/kernel/debug/nv_p2p_fake UGDS_TEST_DRV_BDF=$BDF \
        /bin/conformance --test-threads=1 drv_nvidia_p2p_
    rc=$?
    echo "$BDF" > /sys/bus/pci/drivers/ugds_drv/unbind
    rmmod ugds_drv && rmmod nv_p2p_fake && insmod /bin/ugds_drv.ko && echo "$BDF" > /sys/bus/pci/drivers_probe
    [ $rc -eq 0 ] && [ "$(driver)" = ugds_drv ]
}
run drv-nvidia-p2p-callback p2p 0
run drv-nvidia-p2p-persistent p2p 1
# Unload and load the module three times, the function bound each time.
cycles() {
    for i in 1 2 3; do
        echo "$BDF" > /sys/bus/pci/drivers/ugds_drv/unbind || return 1
        rmmod ugds_drv || return 1
        insmod /bin/ugds_drv.ko || return 1
        echo "$BDF" > /sys/bus/pci/drivers_probe || return 1
        [ "$(driver)" = ugds_drv ] || return 1
        /bin/ugds identify --drv $DRV > /dev/null || return 1
    done
}
run drv-load-unload cycles
# The module's limit on one file's DMA memory: loaded with 4 KiB, bring-up
# (admin queues, an Identify page) cannot get what it needs and says so.
reload() {
    echo "$BDF" > /sys/bus/pci/drivers/ugds_drv/unbind && rmmod ugds_drv && insmod /bin/ugds_drv.ko "$@" &&
        echo "$BDF" > /sys/bus/pci/drivers_probe
}
dma_limit() {
    reload dma_limit_kb=4 || return 1
    out=$(/bin/ugds identify --drv $DRV 2>&1); rc=$?
    echo "$out"
    reload || return 1
    [ $rc -ne 0 ] && echo "$out" | grep -q "Cannot allocate memory" && /bin/ugds identify --drv $DRV > /dev/null
}
run drv-dma-limit dma_limit
# kmemleak reports an object only when two scans find it unreferenced.
leaks() {
    echo scan > /sys/kernel/debug/kmemleak
    sleep 6
    echo scan > /sys/kernel/debug/kmemleak
    cat /sys/kernel/debug/kmemleak > /tmp/leaks
    cat /tmp/leaks
    ! grep -q "unreferenced object" /tmp/leaks
}
run kmemleak-clean leaks
echo "UGDS-GUEST: done"
poweroff -f
