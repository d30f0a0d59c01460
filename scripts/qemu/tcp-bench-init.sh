#!/bin/sh
# /init of the NVMe/TCP benchmark guest: Linux's nvmet exports one
# file-backed namespace over NVMe/TCP on loopback; the same random reads go
# through the guest kernel's own initiator (nvme-tcp, connected through
# /dev/nvme-fabrics as `nvme connect` does: pread O_DIRECT and io_uring on
# its block device) and through ugds's initiator in user space (`ugds bench
# --tcp`), ROUNDS times, alternating.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do insmod /mods/$m 2>/dev/null; done
ip link set lo up
mount -t configfs none /sys/kernel/config 2>/dev/null
NQN=nqn.2026-12.io.ugds:bench
S=/sys/kernel/config/nvmet/subsystems/$NQN
P=/sys/kernel/config/nvmet/ports/1
truncate -s 64M /tmp/tcp.img
mkdir $S && echo 1 > $S/attr_allow_any_host && mkdir $S/namespaces/1 && echo 1 > $S/namespaces/1/buffered_io &&
    echo -n /tmp/tcp.img > $S/namespaces/1/device_path && echo 1 > $S/namespaces/1/enable &&
    mkdir $P && echo tcp > $P/addr_trtype && echo ipv4 > $P/addr_adrfam &&
    echo 127.0.0.1 > $P/addr_traddr && echo 4420 > $P/addr_trsvcid && ln -s $S $P/subsystems/$NQN ||
    echo "UGDS-GUEST: nvmet export failed"
# The namespace written once, so that reads find data.
dd if=/dev/urandom of=/tmp/tcp.img bs=1M count=64 conv=notrunc 2>/dev/null
echo "transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=$NQN" > /dev/nvme-fabrics ||
    echo "UGDS-GUEST: the kernel initiator did not connect"
DEV=""
for t in 1 2 3 4 5 6 7 8 9 10; do
    NS=$(ls /sys/block | grep -m1 '^nvme[0-9]*n[0-9]*$') && [ -b /dev/$NS ] && DEV=/dev/$NS && break
    sleep 1
done
echo "UGDS-GUEST: kernel $(uname -r), kernel initiator's namespace $DEV ($(cat /sys/block/$NS/queue/scheduler 2>/dev/null))"
D=${BENCH_SECS:-2}
R=$((32 * 1024 * 1024))
for i in $(seq 1 ${ROUNDS:-2}); do
    echo "UGDS-GUEST: round $i"
    for w in "4096 1" "4096 32" "131072 8"; do
        set -- $w
        if [ "$2" = 1 ]; then /bin/ugds-kbench --dev $DEV --engine pread --size $1 --qd $2 --duration $D --range $R; fi
        /bin/ugds-kbench --dev $DEV --engine uring --size $1 --qd $2 --duration $D --range $R
        echo "UGDS-BENCH-TCP size=$1 qd=$2"
        /bin/ugds bench --tcp 127.0.0.1:4420 --nqn $NQN -m randread -s $1 -q $2 -d $D --range $R --no-progress |
            grep randread
    done
done
dmesg | grep -iE "nvmet(_tcp)?:.*(error|failed)" | head -5
echo "UGDS-GUEST: done"
poweroff -f
