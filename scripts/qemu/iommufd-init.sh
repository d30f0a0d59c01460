#!/bin/sh
# /init of the iommufd configuration's guest (a kernel with iommufd and the
# vfio cdev, everything built in): the conformance tests and benches through
# /dev/vfio/devices/vfioN + /dev/iommu, polling and interrupts, and once more
# through the group interface of the same kernel.
. /bin/guest-lib.sh
echo "UGDS-GUEST: kernel $(uname -r), NVMe at $BDF"
run bind-vfio /bin/ugds bind $BDF vfio-pci
echo "UGDS-GUEST: vfio cdev $(ls /sys/bus/pci/devices/$BDF/vfio-dev), $(ls /dev/iommu)"
run identify-cdev /bin/ugds identify --pci $BDF --vfio cdev
export UGDS_TEST_PCI=$BDF RUST_BACKTRACE=1
UGDS_TEST_VFIO=cdev run conformance-cdev-poll /bin/conformance --test-threads=1
UGDS_TEST_VFIO=cdev UGDS_TEST_INTERRUPT=1 run conformance-cdev-irq /bin/conformance --test-threads=1
UGDS_TEST_VFIO=group run conformance-group-poll /bin/conformance --test-threads=1
run bench-verify-cdev /bin/ugds bench --pci $BDF --vfio cdev --verify -d 1 -q 4 --range 16M --no-progress
run bench-verify-cdev-irq /bin/ugds bench --pci $BDF --vfio cdev --verify -d 1 -q 4 --range 16M --interrupt --no-progress
run bench-batch-verify-cdev /bin/ugds bench --pci $BDF --vfio cdev --verify -d 1 --batch 16 -m randwrite --range 16M --no-progress
echo "UGDS-GUEST: done"
poweroff -f
