#!/bin/sh
# /init of the tcp configuration's guest: Linux's own NVMe over Fabrics
# target (nvmet, configured through configfs) exports a namespace (a loop
# device over a file) over NVMe/TCP on loopback, and ugds's initiator connects to it
# from user space: `ugds identify --tcp` with and without header and data
# digests, a clear refusal for a subsystem that is not there; the
# conformance suite through `Driver::open_tcp`, without and with digests,
# and with interrupt completion (sleeping on the sockets); the C interface
# (uGDSTcpOpen) with digests;
# `ugds bench --verify` reading and writing; the faults configfs can make
# mid-I/O (the namespace disabled, the port taken away: a clear error, no
# hang); and nothing in the kernel log of nvmet's errors.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null || echo "UGDS-GUEST: insmod $m failed"; done
echo "UGDS-GUEST: kernel $(uname -r)"
ip link set lo up
mount -t configfs none /sys/kernel/config 2>/dev/null
NQN=nqn.2026-12.io.ugds:tcp
nvmet_setup() {
    S=/sys/kernel/config/nvmet/subsystems/$NQN
    P=/sys/kernel/config/nvmet/ports/1
    # A loop device over a file: nvmet's block-device backend, whose Write
    # Zeroes works on any device (the file backend's fallocate does not on
    # the guest's tmpfs: EOPNOTSUPP, reported as Invalid Opcode).
    truncate -s 64M /tmp/tcp.img && losetup /dev/loop0 /tmp/tcp.img &&
        mkdir $S && echo 1 > $S/attr_allow_any_host &&
        mkdir $S/namespaces/1 &&
        echo -n /dev/loop0 > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable &&
        mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam &&
        echo 127.0.0.1 > $P/addr_traddr && echo 4420 > $P/addr_trsvcid &&
        ln -s $S $P/subsystems/$NQN
}
run nvmet-tcp-export nvmet_setup
identify_check() {
    out=$(/bin/ugds identify --tcp 127.0.0.1:4420 --nqn $NQN "$@" 2>&1); rc=$?
    echo "$out"
    [ $rc -eq 0 ] && echo "$out" | grep -q "^model        Linux" && echo "$out" | grep -q "^  nsid 1 " || return 1
    case " $* " in
        *" --digests "*) echo "$out" | grep -q "^digests      header on, data on" ;;
        *) echo "$out" | grep -q "^digests      header off, data off" ;;
    esac
}
run identify-tcp identify_check
run identify-tcp-digests identify_check --digests
wrong_nqn() {
    out=$(/bin/ugds identify --tcp 127.0.0.1:4420 --nqn nqn.2026-12.io.ugds:absent 2>&1); rc=$?
    echo "$out"
    [ $rc -ne 0 ] && echo "$out" | grep -q -E "refused Connect|Connect failed"
}
run identify-tcp-unknown-subsystem wrong_nqn
export RUST_BACKTRACE=1
UGDS_TEST_TCP=127.0.0.1:4420/$NQN run conformance-tcp /bin/conformance --test-threads=1
UGDS_TEST_TCP=127.0.0.1:4420/$NQN UGDS_TEST_TCP_DIGESTS=1 run conformance-tcp-digests /bin/conformance --test-threads=1
UGDS_TEST_TCP=127.0.0.1:4420/$NQN UGDS_TEST_INTERRUPT=1 run conformance-tcp-irq /bin/conformance --test-threads=1
UGDS_TEST_TCP=127.0.0.1:4420/$NQN run capi-tcp /bin/capi-tcp --test-threads=1
run bench-tcp-verify /bin/ugds bench --tcp 127.0.0.1:4420 --nqn $NQN --verify -d 1 -q 8 -s 4k,128k --range 32M \
    --no-progress
run bench-tcp-write-digests /bin/ugds bench --tcp 127.0.0.1:4420 --nqn $NQN --digests --rw randwrite -d 1 -q 8 \
    -s 4k,64k --range 32M --no-progress
# The target's own account of everything so far (before the faults, which
# make it log on purpose): nvmet logs each transport error it meets (a bad
# digest, a PDU it cannot take, a command it refuses); the unknown
# subsystem above is the one line expected.
nvmet_clean() {
    errs=$(dmesg | grep -iE "nvmet(_tcp)?:.*(digest|error|invalid|failed|unexpected)" | grep -v "invalid subsystem nqn.2026-12.io.ugds:absent")
    echo "$errs"
    dmesg | grep -ciE "nvmet" | sed 's/^/nvmet log lines: /'
    [ -z "$errs" ]
}
run nvmet-log-has-no-errors nvmet_clean
# fault_mid_io NAME BREAK MEND: `ugds bench` reads for up to 60 s; after 3 s
# (with reads completing: its last progress line counts some), BREAK (a
# configfs change); the bench must end with an error within 30 s (no hang,
# no success), then MEND restores the export.
fault_mid_io() {
    /bin/ugds bench --tcp 127.0.0.1:4420 --nqn $NQN -d 60 -q 8 --range 32M --progress-lines > /tmp/$1.out 2>&1 &
    pid=$!
    sleep 3
    last=""
    while read -r l; do case $l in *"I/Os done"*) last=$l;; esac; done < /tmp/$1.out
    echo "before the fault: $last"
    case $last in
        *"I/Os done, "[1-9]*) ;;
        *) echo "no reads completing before the fault"; kill -9 $pid; cat /tmp/$1.out; return 1;;
    esac
    $2
    i=0
    while kill -0 $pid 2>/dev/null && [ $i -lt 30 ]; do sleep 1; i=$((i + 1)); done
    if kill -0 $pid 2>/dev/null; then echo "the bench still runs 30 s after the fault"; kill -9 $pid; $3; return 1; fi
    wait $pid; rc=$?
    tail -3 /tmp/$1.out
    $3
    echo "bench rc $rc, $i s after the fault"
    [ $rc -ne 0 ] && grep -q -iE "error|failed" /tmp/$1.out
}
ns_off() { echo 0 > $S/namespaces/1/enable; }
ns_on() { echo 1 > $S/namespaces/1/enable; }
port_off() { rm $P/subsystems/$NQN; }
port_on() { ln -s $S $P/subsystems/$NQN; }
run fault-namespace-disabled-mid-io fault_mid_io ns ns_off ns_on
run fault-port-removed-mid-io fault_mid_io port port_off port_on
echo "UGDS-GUEST: done"
poweroff -f
