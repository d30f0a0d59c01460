#!/bin/sh
# /init of the tcp configuration's guest: Linux's own NVMe over Fabrics
# target (nvmet, configured through configfs) exports a file-backed
# namespace over NVMe/TCP on loopback, and ugds's initiator connects to it
# from user space: the handshake, Fabrics Connect, the registers through
# Property Get and Set, Identify (`ugds identify --tcp`), with and without
# header and data digests, and a clear refusal for a subsystem that is not
# there. (The admin queue only, so far: I/O queues are the next step.)
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null || echo "UGDS-GUEST: insmod $m failed"; done
echo "UGDS-GUEST: kernel $(uname -r)"
ip link set lo up
mount -t configfs none /sys/kernel/config 2>/dev/null
NQN=nqn.2026-12.io.ugds:tcp
nvmet_setup() {
    S=/sys/kernel/config/nvmet/subsystems/$NQN
    P=/sys/kernel/config/nvmet/ports/1
    truncate -s 64M /tmp/tcp.img &&
        mkdir $S && echo 1 > $S/attr_allow_any_host &&
        mkdir $S/namespaces/1 && echo 1 > $S/namespaces/1/buffered_io &&
        echo -n /tmp/tcp.img > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable &&
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
echo "UGDS-GUEST: done"
poweroff -f
