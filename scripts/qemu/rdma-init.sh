#!/bin/sh
# /init of the rdma configuration's guest: what soft RoCE and NVMe over
# RDMA can do in this guest kernel, step by step: rdma_rxe on a dummy
# interface, its verbs device for user space, `ugds rdma` (a glibc build of
# ugds: libibverbs and its rxe provider loaded at run time) listing it and
# registering host memory and a dma-buf, nvmet-rdma listening, ugds's own
# NVMe/RDMA initiator (`ugds rdma --connect`: admin queue, one I/O queue, a
# write and a read through registered host memory, checked against the
# backing file; refusals), a handle on it (`Driver::open_rdma`: the
# conformance suite polled on registered buffers and with interrupt
# completion (completion channels) copying all data, `ugds bench --rdma`
# verified and writing, polled and with interrupts; the port removed
# mid-I/O ends the bench with an error, never a hang, polled and with
# interrupts), and the kernel's own nvme-rdma initiator reading through the
# same port.
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
export RUST_BACKTRACE=1
# A handle on the controller (Driver::open_rdma): the conformance suite
# polled with the caller's buffers registered (the target moves their data
# itself), and with interrupt completion and no buffer registered (every
# command's data copied through the queues' memory); then `ugds bench`
# writing and reading with verification, its data never copied, and
# writing with --rdma-copy, every command's data copied.
UGDS_TEST_RDMA=10.9.0.1:4420/$NQN run conformance-rdma /bin/conformance --test-threads=1
UGDS_TEST_RDMA=10.9.0.1:4420/$NQN UGDS_TEST_INTERRUPT=1 UGDS_TEST_RDMA_COPY=1 run conformance-rdma-irq-copy \
    /bin/conformance --test-threads=1
verify_bench() {
    out=$(/bin/ugds bench --rdma 10.9.0.1:4420 --nqn $NQN --verify -d 1 -q 32 -s 4k,128k,1m --range 32M \
        --no-progress 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && ! echo "$out" | grep -q "copied through"
}
run bench-rdma-verify verify_bench
copy_bench() {
    out=$(/bin/ugds bench --rdma 10.9.0.1:4420 --nqn $NQN --rdma-copy --rw randwrite -d 1 -q 64 -s 4k,64k --range 32M \
        --no-progress 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && echo "$out" | grep -q "data copied through the queue's own memory"
}
run bench-rdma-write-copy copy_bench
# The same reads with the buffers registered and with every command's data
# copied, one after the other in this boot (figures under TCG: only the
# difference between the two means anything).
copy_or_not() {
    for how in "" --rdma-copy; do
        out=$(/bin/ugds bench --rdma 10.9.0.1:4420 --nqn $NQN $how -d 2 -q 8 -s 4k,128k --range 32M --no-progress \
            2>&1); rc=$?
        echo "$out" | grep -E "^(target|randread|queue)"
        [ $rc -eq 0 ] || { echo "$out"; return 1; }
    done
}
run bench-rdma-registered-or-copied copy_or_not
# Interrupt completion: every queue has a vector (its completion channel
# watched), the lent queue's waits woken through it (interrupts counted),
# the data verified, and no wake-up lost (a wait that slept to its 100 ms
# cap and then found its work ready).
irq_bench() {
    out=$(/bin/ugds bench --rdma 10.9.0.1:4420 --nqn $NQN --interrupt --verify -d 1 -q 32 -s 4k,128k --range 32M \
        --no-progress 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && echo "$out" | grep -q "q2 lendable vector 2" && ! echo "$out" | grep -q " polled" &&
        echo "$out" | grep -q "found their work ready (a lost wake-up): 0$" &&
        ! echo "$out" | grep -q " 0 interrupts per command"
}
run bench-rdma-interrupt irq_bench
# The port removed mid-I/O (configfs): `ugds bench --rdma` reads for up to
# 60 s; after 3 s (reads completing) the subsystem leaves the port, which
# disconnects its hosts; the bench must end with an error within 30 s (no
# hang, no success); then the port is restored for the kernel's initiator.
port_removed_mid_io() {
    /bin/ugds bench --rdma 10.9.0.1:4420 --nqn $NQN -d 60 -q 8 --range 32M --progress-lines "$@" > /tmp/fault.out 2>&1 &
    pid=$!
    sleep 3
    last=""
    while read -r l; do case $l in *"I/Os done"*) last=$l;; esac; done < /tmp/fault.out
    echo "before the fault: $last"
    case $last in
        *"I/Os done, "[1-9]*) ;;
        *) echo "no reads completing before the fault"; kill -9 $pid; cat /tmp/fault.out; return 1;;
    esac
    rm $P/subsystems/$NQN
    i=0
    while kill -0 $pid 2>/dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
    if kill -0 $pid 2>/dev/null; then
        echo "the bench still runs 30 s after the fault"; kill -9 $pid; grep -v "I/Os done" /tmp/fault.out | tail -30
        ln -s $S $P/subsystems/$NQN; return 1
    fi
    wait $pid; rc=$?
    tail -3 /tmp/fault.out
    ln -s $S $P/subsystems/$NQN
    echo "bench rc $rc, $i s after the fault"
    # Each ended queue stopped its queue pair before it reported its
    # commands (else they would be left to time out).
    ! grep "left to time out" /tmp/fault.out && [ $rc -ne 0 ] && grep -q -iE "error|failed" /tmp/fault.out
}
run fault-rdma-port-removed-mid-io port_removed_mid_io
run fault-rdma-port-removed-mid-io-irq port_removed_mid_io --interrupt
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
