# Sourced by every guest /init (make_initramfs puts it in /bin): the file
# systems, the NVMe function's address in $BDF, and run NAME CMD..., which
# brackets a step with the UGDS-BEGIN / UGDS-RESULT lines the harness counts.
export PATH=/bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /tmp
BDF=""
for d in /sys/bus/pci/devices/*; do [ "$(cat $d/class)" = "0x010802" ] && BDF=$(basename $d); done
run() {
    name=$1; shift
    echo "UGDS-BEGIN $name"
    "$@"
    echo "UGDS-RESULT $name rc=$?"
}
