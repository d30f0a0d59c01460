#!/bin/sh
# /init of the volume configuration's guest: three NVMe controllers, two
# under an emulated PCIe switch (serials ugds-vol0 and ugds-vol1) and one on
# a root port of its own (ugds-vol2), bound to vfio-pci and used as one
# volume: the volume tests (striped, concatenated, vectored, batch, bad
# input; where each member sits), polling and interrupts, and `ugds bench`
# over the three, striped and concatenated, every byte checked.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m || echo "UGDS-GUEST: insmod $m failed"; done
sleep 1
echo "UGDS-GUEST: kernel $(uname -r)"
# The controllers by serial, read while nvme holds them.
for d in /sys/bus/pci/devices/*; do
    [ "$(cat $d/class)" = "0x010802" ] || continue
    s=$(cat $d/nvme/nvme*/serial 2>/dev/null)
    case $s in
        ugds-vol0*) V0=$(basename $d) ;;
        ugds-vol1*) V1=$(basename $d) ;;
        ugds-vol2*) V2=$(basename $d) ;;
    esac
done
echo "UGDS-GUEST: members $V0 $V1 (under the switch) and $V2 (own root port)"
for b in $V0 $V1 $V2; do
    echo "UGDS-GUEST: $b at $(readlink -f /sys/bus/pci/devices/$b), IOMMU group $(basename $(readlink /sys/bus/pci/devices/$b/iommu_group))"
done
bind_all() { for b in $V0 $V1 $V2; do /bin/ugds bind $b vfio-pci || return 1; done; }
run bind-three bind_all
export UGDS_TEST_VOLUME=$V0,$V1,$V2 UGDS_TEST_VOLUME_TOPOLOGY=1 RUST_BACKTRACE=1
run volume-tests-poll /bin/volume --test-threads=1
UGDS_TEST_INTERRUPT=1 run volume-tests-irq /bin/volume --test-threads=1
run bench-volume-striped-verify /bin/ugds bench --pci $V0 --pci $V1 --pci $V2 --stripe 64k --verify -d 1 -q 4 \
    -s 4k,256k --range 48M --no-progress
run bench-volume-concat-verify /bin/ugds bench --pci $V0 --pci $V1 --pci $V2 --concat --verify -d 1 -q 1 \
    -m randwrite --range 48M --no-progress
echo "UGDS-GUEST: done"
poweroff -f
