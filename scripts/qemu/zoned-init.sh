#!/bin/sh
# /init of the zoned configuration's guest: QEMU's controller with one
# zoned namespace (NVMe ZNS: writes only at each zone's write pointer).
# ugds refuses it at open with one error naming it, on the kernel path
# (its block device, and its generic character device through passthrough)
# and through vfio-pci, rather than driving it as plain blocks.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m || echo "UGDS-GUEST: insmod $m failed"; done
sleep 1
echo "UGDS-GUEST: kernel $(uname -r), NVMe at $BDF"
NS=$(ls /sys/block | grep -m1 '^nvme[0-9]*n[0-9]*$')
NG=$(echo $NS | sed 's/^nvme/ng/')
# refused PATTERN CMD...: CMD fails, and says PATTERN.
refused() {
    pattern=$1; shift
    out=$("$@" 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "$pattern"
}
zoned() { z=$(cat /sys/block/$NS/queue/zoned); echo "/dev/$NS: $z"; [ "$z" = host-managed ]; }
run namespace-is-zoned zoned
B="-d 1 -q 4 --range 4M --verify --no-progress"
# shellcheck disable=SC2086
run kernel-block-refused refused "is a zoned device" /bin/ugds bench --file /dev/$NS $B
# shellcheck disable=SC2086
run kernel-passthrough-refused refused "is a zoned device" /bin/ugds bench --file /dev/$NG $B
run bind-vfio /bin/ugds bind $BDF vfio-pci
# shellcheck disable=SC2086
run vfio-refused refused "command set is Zoned Namespace" /bin/ugds bench --pci $BDF $B
echo "UGDS-GUEST: done"
poweroff -f
