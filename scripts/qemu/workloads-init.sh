#!/bin/sh
# /init of the workloads guest (scripts/qemu-workloads): issue 17's tables
# on QEMU's NVMe controller through vfio-pci: the scheduler's mixed table,
# the modes table, vectored reads (one SGL, PRP windows, separate calls),
# and the scheduler's cost at queue depth 1 (on, and off: round robin with
# no interleaving).
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m; done
sleep 2
D=${BENCH_SECS:-2}
/bin/ugds bind $BDF vfio-pci > /dev/null || echo "UGDS-GUEST: bind vfio-pci failed"
/bin/ugds identify --pci $BDF | grep -E "^(model|mdts|sgls)"
echo "UGDS-WORKLOAD mixed: ugds bench --pci $BDF --mixed --interrupt -d $D"
/bin/ugds bench --pci $BDF --mixed --interrupt -d $D
echo "UGDS-WORKLOAD modes: ugds bench --pci $BDF --modes -t 1 -d $D"
/bin/ugds bench --pci $BDF --modes -t 1 -d $D
echo "UGDS-WORKLOAD vectored: ugds bench --pci $BDF --vectored 32 -s 16k -d $D"
/bin/ugds bench --pci $BDF --vectored 32 -s 16k -d $D
for i in 1 2; do
    for s in "" "--placement round-robin --chunk 0"; do
        echo "UGDS-WORKLOAD cost: ugds bench --pci $BDF -q 1 -d $D --no-progress $s"
        /bin/ugds bench --pci $BDF -q 1 -d $D --no-progress $s | grep randread
    done
done
echo "UGDS-GUEST: done"
poweroff -f
