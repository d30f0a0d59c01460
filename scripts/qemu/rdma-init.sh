#!/bin/sh
# /init of the rdma configuration's guest: what soft RoCE and NVMe over
# RDMA can do in this guest kernel, step by step: rdma_rxe on a dummy
# interface, its verbs device for user space, `ugds rdma` (a glibc build of
# ugds: libibverbs and its rxe provider loaded at run time) listing it and
# registering host memory and a dma-buf, nvmet-rdma listening, ugds's own
# NVMe/RDMA initiator (`ugds rdma --connect`: admin queue, one I/O queue, a
# write and a read through registered host memory, checked against the
# backing file; refusals), and the kernel's own nvme-rdma initiator reading
# through the same port.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null || echo "UGDS-GUEST: insmod $m failed"; done
echo "UGDS-GUEST: kernel $(uname -r)"
ip link set lo up
mount -t configfs none /sys/kernel/config 2>/dev/null
netdev() { ip link add d0 type dummy && ip addr add 10.9.0.1/24 dev d0 && ip link set d0 up && ip addr show d0; }
run dummy-netdev netdev
rxe() { /bin/rdma link add rxe0 type rxe netdev d0 && /bin/rdma link show && ls /sys/class/infiniband/; }
run rxe-on-dummy rxe
uverbs() { ls -l /dev/infiniband/ && cat /sys/class/infiniband_verbs/uverbs0/ibdev; }
run verbs-device-for-user-space uverbs
ugds_rdma() {
    out=$(/bin/ugds rdma 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && echo "$out" | grep -q "^device       rxe0" && echo "$out" | grep -q "host memory  1 MiB registered"
}
run ugds-rdma ugds_rdma
NQN=nqn.2026-12.io.ugds:rdma
S=/sys/kernel/config/nvmet/subsystems/$NQN
P=/sys/kernel/config/nvmet/ports/2
export_rdma() {
    truncate -s 64M /tmp/r.img && losetup /dev/loop0 /tmp/r.img &&
        mkdir $S && echo 1 > $S/attr_allow_any_host && mkdir $S/namespaces/1 &&
        echo -n /dev/loop0 > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable &&
        mkdir $P && echo rdma > $P/addr_trtype && echo ipv4 > $P/addr_adrfam &&
        echo 10.9.0.1 > $P/addr_traddr && echo 4420 > $P/addr_trsvcid && ln -s $S $P/subsystems/$NQN
}
run nvmet-rdma-export export_rdma
ugds_connect() {
    /bin/ugds rdma --connect 10.9.0.1:4420 --nqn $NQN --write --bytes 128k --dump /tmp/u.bin || return 1
    # What the target wrote to its backing file is what ugds wrote and read.
    dd if=/tmp/r.img of=/tmp/f.bin bs=131072 count=1 2>/dev/null && cmp /tmp/u.bin /tmp/f.bin &&
        echo "the backing file holds the 128 KiB ugds wrote"
}
run ugds-nvme-rdma-write-read ugds_connect
ugds_refusals() {
    out=$(/bin/ugds rdma --connect 10.9.0.1:4420 --nqn nqn.2026-12.io.ugds:nobody 2>&1); rc=$?
    echo "unknown subsystem: rc $rc: $out"
    [ $rc -ne 0 ] && echo "$out" | grep -q "Connect" || return 1
    out=$(/bin/ugds rdma --connect 10.9.0.1:4421 --nqn $NQN 2>&1); rc=$?
    echo "no port: rc $rc: $out"
    [ $rc -ne 0 ] && echo "$out" | grep -qi "rdma" || return 1
}
run ugds-nvme-rdma-refusals ugds_refusals
kconnect() {
    echo "transport=rdma,traddr=10.9.0.1,trsvcid=4420,nqn=$NQN" > /dev/nvme-fabrics || return 1
    sleep 1
    ls /sys/block
    NS=$(ls /sys/block | grep -m1 '^nvme[0-9]*n[0-9]*$') || return 1
    dd if=/dev/$NS of=/dev/null bs=1M count=16 2>&1 | tail -1
}
run kernel-nvme-rdma-read kconnect
dmesg | grep -iE "rxe|rdma|nvme" | tail -20
echo "UGDS-GUEST: done"
poweroff -f
