# Sourced by every guest /init (make_initramfs puts it in /bin): the file
# systems, the NVMe function's address in $BDF, and run NAME CMD..., which
# brackets a step with the UGDS-BEGIN / UGDS-RESULT lines the harness counts.
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /tmp
BDF=""
# The matrix configuration this guest boots in (ugds.config= on the command line).
CONFIG=$(sed -n 's/.*ugds\.config=\([^ ]*\).*/\1/p' /proc/cmdline)
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "0x010802" ] && BDF=$(basename $d); done
run() {
    name=$1; shift
    echo "UGDS-BEGIN $name"
    "$@"
    echo "UGDS-RESULT $name rc=$?"
}

# drv_kill_check DRV [BENCH-ARGS...]: runs `ugds bench` on DRV, proves I/O
# is in flight (its last progress line, a second's count, shows completions),
# kills it with -9 there, and checks that the module then holds nothing (its
# counters, through `ugds identify`).
drv_kill_check() {
    drv=$1; shift
    /bin/ugds bench --drv $drv -d 60 --range 16M --progress-lines "$@" > /tmp/killed.out 2>&1 &
    pid=$!
    sleep 4
    last=""
    while read -r l; do case $l in *"I/Os done"*) last=$l;; esac; done < /tmp/killed.out
    echo "in flight at the kill: $last"
    case $last in
        *"I/Os done, "[1-9]*) ;;
        *) echo "no completions in the last second: no I/O in flight"; kill -9 $pid; cat /tmp/killed.out; return 1;;
    esac
    # The device is held (one opener at a time).
    if /bin/ugds identify --drv $drv > /dev/null 2>&1; then echo "the bench did not hold the device"; kill -9 $pid; return 1; fi
    kill -9 $pid
    sleep 1
    line=$(/bin/ugds identify --drv $drv | head -1)
    echo "$line"
    echo "$line" | grep -q "before this run: 0 pinned pages, 0 ledger entries"
}

# drv_steps DRV: the ugds_drv steps both guests run once the function is
# bound to ugds_drv: conformance (polling, interrupts), the C interface, a
# verified bench, three kill checks (queue pairs, batches, stream-ordered
# operations in flight: nothing left pinned or mapped), and the module's
# lifecycle (mmap racing MAP, unbind while BAR0 and DMA memory are mapped
# with SIGBUS after it, close after unbind, rebind).
drv_steps() {
    export UGDS_TEST_DRV=$1 RUST_BACKTRACE=1
    run drv-conformance-poll /bin/conformance --test-threads=1
    UGDS_TEST_INTERRUPT=1 run drv-conformance-irq /bin/conformance --test-threads=1
    run drv-c-interface /bin/capi-drv --test-threads=1
    run drv-bench-verify /bin/ugds bench --drv $1 --verify -d 1 -q 4 --range 16M --no-progress
    # Several processes on the controller: in the default configuration only.
    [ "$CONFIG" = default ] && run drv-serve serve_check --drv $1
    run drv-kill-leaves-nothing drv_kill_check $1 -q 32
    run drv-kill-batch-leaves-nothing drv_kill_check $1 --batch 16
    run drv-kill-stream-leaves-nothing drv_kill_check $1 --stream -q 8
    export UGDS_TEST_DRV_BDF=$BDF
    run drv-lifecycle /bin/conformance --test-threads=1 drv_lifecycle_
    unset UGDS_TEST_DRV_BDF
}

# serve_check TARGET-FLAGS...: `ugds serve` owns the controller; processes
# attach with queue pairs of their own (issue 43). Four processes of two
# queue pairs verify writes then reads on the shared namespace; with
# ugds_drv the conformance suite runs attached (dma-bufs imported by the
# owner), polled and with interrupts; twice a
# process is killed (-9) mid-I/O beside two that verify; four verify on a
# namespace split in four; then the owner is killed (-9) under a client,
# which must fail (not hang), and the controller must be free again.
serve_check() {
    sock=/tmp/ugds-serve.sock
    rm -f $sock
    /bin/ugds serve --socket $sock "$@" > /tmp/serve.out 2>&1 &
    owner=$!
    for i in $(seq 100); do [ -S $sock ] && break; sleep 0.1; done
    B="/bin/ugds bench --attach $sock --range 16M --no-progress --verify"
    $B -p 4 -t 2 -q 4 -d 1 --rw randwrite || { kill $owner; return 1; }
    $B -p 4 -t 2 -q 4 -d 1 || { kill $owner; return 1; }
    # Through ugds_drv's owner (which imports dma-bufs): the conformance
    # suite as an attached process, polled and with interrupts.
    if [ "$1" = --drv ]; then
        ( unset UGDS_TEST_DRV UGDS_TEST_PCI UGDS_TEST_INTERRUPT; UGDS_TEST_ATTACH=$sock /bin/conformance --test-threads=1 ) ||
            { kill $owner; return 1; }
        ( unset UGDS_TEST_DRV UGDS_TEST_PCI; UGDS_TEST_ATTACH=$sock UGDS_TEST_INTERRUPT=1 /bin/conformance --test-threads=1 ) ||
            { kill $owner; return 1; }
    fi
    for round in 1 2; do
        $B -q 8 -d 30 --rw randwrite > /tmp/victim.out 2>&1 &
        victim=$!
        $B -p 2 -q 4 -d 3 --rw randwrite > /tmp/survivors.out 2>&1 &
        survivors=$!
        sleep 1.5
        kill -9 $victim; wait $victim
        wait $survivors || { cat /tmp/survivors.out; kill $owner; return 1; }
        grep -c " 0 mismatched" /tmp/survivors.out
    done
    kill -TERM $owner; wait $owner
    cat /tmp/serve.out
    grep -q "0 left their memory mapped" /tmp/serve.out || return 1
    rm -f $sock
    /bin/ugds serve --socket $sock --split 4 "$@" > /tmp/serve.out 2>&1 &
    owner=$!
    for i in $(seq 100); do [ -S $sock ] && break; sleep 0.1; done
    $B -p 4 -q 4 -d 1 > /tmp/split.out 2>&1 || { cat /tmp/split.out; kill $owner; return 1; }
    [ "$(grep -c ' 0 mismatched' /tmp/split.out)" = 4 ] || { cat /tmp/split.out; kill $owner; return 1; }
    /bin/ugds bench --attach $sock -q 8 -d 60 --rw randwrite --no-progress > /tmp/orphan.out 2>&1 &
    client=$!
    sleep 1.5
    kill -9 $owner; wait $owner
    start=$(date +%s)
    if wait $client; then echo "the client went on without its owner"; return 1; fi
    echo "client ended $(( $(date +%s) - start )) s after its owner: $(grep -m1 -i 'error\|gone' /tmp/orphan.out)"
    sleep 1
    # The controller is free again: another process opens it.
    /bin/ugds identify "$@" | head -3
}
