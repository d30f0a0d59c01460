#!/bin/sh
# /init of the benchmark guest: the same random reads through the guest
# kernel's nvme driver (pread O_DIRECT, io_uring with and without polling,
# and ugds's kernel path: io_uring on the block device, and NVMe commands
# passed through io_uring on the generic character device),
# then through ugds on vfio-pci (with and without shadow doorbells), and the
# floor (examples/floor). ROUNDS times, alternating: the host's speed drifts
# within a boot as well as between boots, and alternating lets the drift hit
# both sides alike.
. /bin/guest-lib.sh
for m in $(cat /mods/order); do
    case $m in nvme.ko) insmod /mods/$m poll_queues=1 ;; *) insmod /mods/$m ;; esac
done
sleep 2
echo "UGDS-GUEST: NVMe $BDF, poll queues $(cat /sys/module/nvme/parameters/poll_queues), clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)"
D=${BENCH_SECS:-2}
R=$((32 * 1024 * 1024))
kernel_round() {
    # After a rebind the names may change: wait for the namespace's block device.
    NS=""
    for t in 1 2 3 4 5 6 7 8 9 10; do
        NS=$(ls /sys/block | grep -m1 '^nvme[0-9]*n[0-9]*$') && [ -b /dev/$NS ] && break
        sleep 1
    done
    DEV=/dev/$NS
    for w in "4096 1" "4096 32" "131072 8"; do
        set -- $w
        if [ "$2" = 1 ]; then /bin/ugds-kbench --dev $DEV --engine pread --size $1 --qd $2 --duration $D --range $R; fi
        /bin/ugds-kbench --dev $DEV --engine uring --size $1 --qd $2 --duration $D --range $R
        /bin/ugds-kbench --dev $DEV --engine uring-poll --size $1 --qd $2 --duration $D --range $R
        echo "UGDS-BENCH-KP engine=ugds-kernel-path size=$1 qd=$2"
        /bin/ugds bench --file $DEV -m randread -s $1 -q $2 -d $D --range $R --no-progress | grep randread
        echo "UGDS-BENCH-KP engine=ugds-passthrough size=$1 qd=$2"
        /bin/ugds bench --file /dev/$(echo $NS | sed 's/^nvme/ng/') -m randread -s $1 -q $2 -d $D --range $R --no-progress | grep randread
    done
}
ugds_round() {
    /bin/floor $BDF $D ${FLOOR_MODES:-raw1,read,raw32,queue32,raw8-128k,queue8-128k}
    [ -n "$FLOOR_ONLY" ] && return
    /bin/ugds bench --pci $BDF -m randread -s 4096 -q 1 -d 0.2 --no-progress | grep -m1 "doorbells:" | sed 's/^ */UGDS-GUEST: default /'
    for w in "4096 1" "4096 32" "131072 8"; do
        set -- $w
        for sd in --shadow-doorbells --no-shadow-doorbells; do
            echo "UGDS-BENCH size=$1 qd=$2 shadow=$([ "$sd" = --shadow-doorbells ] && echo on || echo off)"
            /bin/ugds bench --pci $BDF -m randread -s $1 -q $2 -d $D --range $R --no-progress $sd | grep randread
        done
        if [ -n "$UGDS_BENCH_EXTRA" ]; then
            echo "UGDS-EXTRA size=$1 qd=$2: $UGDS_BENCH_EXTRA"
            /bin/ugds bench --pci $BDF -m randread -s $1 -q $2 -d $D --range $R --no-progress $UGDS_BENCH_EXTRA | grep randread
        fi
    done
}
for i in $(seq 1 ${ROUNDS:-2}); do
    echo "UGDS-GUEST: round $i"
    [ -z "$FLOOR_ONLY" ] && kernel_round
    /bin/ugds bind $BDF vfio-pci > /dev/null || echo "UGDS-GUEST: bind vfio-pci failed"
    ugds_round
    /bin/ugds bind $BDF nvme > /dev/null || echo "UGDS-GUEST: bind nvme failed"
    sleep 1
done
echo "UGDS-GUEST: done"
poweroff -f
