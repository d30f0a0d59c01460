#!/bin/sh
# /init of the conformance guest: bind the NVMe function to vfio-pci and run
# ugds's conformance tests and `ugds bench --verify` against it.
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /tmp
for m in $(cat /mods/order); do insmod /mods/$m || echo "UGDS-GUEST: insmod $m failed"; done
sleep 1
BDF=""
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "0x010802" ] && BDF=$(basename $d); done
echo "UGDS-GUEST: kernel $(uname -r), NVMe at $BDF"
if [ -e /sys/bus/pci/devices/$BDF/driver ]; then echo $BDF > /sys/bus/pci/devices/$BDF/driver/unbind; fi
echo vfio-pci > /sys/bus/pci/devices/$BDF/driver_override
echo $BDF > /sys/bus/pci/drivers_probe
echo "UGDS-GUEST: driver $(basename $(readlink /sys/bus/pci/devices/$BDF/driver))"
run() {
    name=$1; shift
    echo "UGDS-BEGIN $name"
    "$@"
    echo "UGDS-RESULT $name rc=$?"
}
export UGDS_TEST_PCI=$BDF RUST_BACKTRACE=1
run conformance-poll /bin/conformance --test-threads=1
UGDS_TEST_INTERRUPT=1 run conformance-irq /bin/conformance --test-threads=1
run bench-verify /bin/ugds bench --pci $BDF --verify -d 1 -q 4 --range 16M --no-progress
run bench-verify-irq /bin/ugds bench --pci $BDF --verify -d 1 -q 4 --range 16M --interrupt --no-progress
run bench-batch-verify /bin/ugds bench --pci $BDF --verify -d 1 --batch 16 -m randwrite --range 16M --no-progress
run identify /bin/ugds identify --pci $BDF

# The same controller through our kernel module.
insmod /bin/ugds_drv.ko || echo "UGDS-GUEST: insmod ugds_drv failed"
echo $BDF > /sys/bus/pci/devices/$BDF/driver/unbind
echo ugds_drv > /sys/bus/pci/devices/$BDF/driver_override
echo $BDF > /sys/bus/pci/drivers_probe
echo "UGDS-GUEST: driver $(basename $(readlink /sys/bus/pci/devices/$BDF/driver)), $(ls /dev/ugds_drv*)"
DRV=/dev/ugds_drv0
unset UGDS_TEST_PCI
export UGDS_TEST_DRV=$DRV
run drv-conformance-poll /bin/conformance --test-threads=1
UGDS_TEST_INTERRUPT=1 run drv-conformance-irq /bin/conformance --test-threads=1
run drv-bench-verify /bin/ugds bench --drv $DRV --verify -d 1 -q 4 --range 16M --no-progress
# A process killed with I/O in flight leaves nothing pinned or mapped.
kill_check() {
    /bin/ugds bench --drv $DRV -d 60 -q 32 --range 16M --no-progress > /tmp/killed.out 2>&1 &
    pid=$!
    sleep 3
    # While it runs the device is held (one opener at a time).
    if /bin/ugds identify --drv $DRV > /dev/null 2>&1; then echo "the bench did not hold the device"; return 1; fi
    kill -9 $pid
    sleep 1
    line=$(/bin/ugds identify --drv $DRV | head -1)
    echo "$line"
    echo "$line" | grep -q "before this run: 0 pinned pages, 0 ledger entries"
}
run drv-kill-leaves-nothing kill_check
echo "UGDS-GUEST: done"
poweroff -f
