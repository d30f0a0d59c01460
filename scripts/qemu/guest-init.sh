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
echo "UGDS-GUEST: done"
poweroff -f
