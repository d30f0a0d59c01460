# Shared by scripts/qemu-conformance and scripts/qemu-bench: QEMU and the
# guest kernel from Debian's archive, static guest binaries, the initramfs,
# and the controller configurations. Source it from the repository root.

KV=6.12.95+deb12-amd64
KVER=6.12.95-1~bpo12+1
ROOT=$PWD
W=$ROOT/target/qemu
K=$W/kernel
TGT=x86_64-unknown-linux-gnu
mkdir -p "$W"
T0=${T0:-$(date +%s)}
say() { echo "[$(basename "$0") $(( $(date +%s) - T0 ))s] $*"; }

# QEMU 10 from bookworm-backports, busybox, cpio, kmod, and mkfs.btrfs and
# mkfs.xfs for the guests' binding steps.
ensure_packages() {
    if ! command -v qemu-system-x86_64 >/dev/null || ! command -v busybox >/dev/null || ! command -v cpio >/dev/null \
        || ! command -v mkfs.btrfs >/dev/null || ! command -v mkfs.xfs >/dev/null; then
        if [ ! -e /etc/apt/sources.list.d/bookworm-backports.sources ]; then
            awk 'NR==1,/^Suites:/' /etc/apt/sources.list.d/debian.sources | grep -v '^#' \
                | sed 's/^Suites:.*/Suites: bookworm-backports/' > /etc/apt/sources.list.d/bookworm-backports.sources
            printf 'Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
                >> /etc/apt/sources.list.d/bookworm-backports.sources
        fi
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends busybox-static cpio kmod xz-utils \
            btrfs-progs xfsprogs >/dev/null
    fi
    say "packages ready ($(qemu-system-x86_64 --version | head -1))"
}

# The guest kernel, unpacked under target/qemu (never installed).
ensure_kernel() {
    if [ ! -e "$K/boot/vmlinuz-$KV" ]; then
        mkdir -p "$W/debs" "$K"
        (cd "$W/debs" && apt-get download -qq "linux-image-$KV-unsigned=$KVER" 2>&1 | grep -v unsandboxed || true)
        dpkg -x "$W"/debs/linux-image-$KV-unsigned_*.deb "$K"
        depmod -b "$K" -F "$K/boot/System.map-$KV" "$KV"
    fi
    say "kernel $KV ready"
}

# The same kernel's headers and kbuild, and a compiler, for kmod/ugds_drv.
ensure_headers() {
    local H=$K/usr/src/linux-headers-$KV
    if ! command -v gcc-12 >/dev/null || ! command -v make >/dev/null || ! command -v pahole >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc-12 gcc make libc6-dev dwarves bc perl >/dev/null
    fi
    if [ ! -e "$H/Makefile" ]; then
        local common=${KV%-amd64}
        (cd "$W/debs" && apt-get download -qq "linux-headers-$KV=$KVER" "linux-headers-$common-common=$KVER" \
            "linux-kbuild-${common}=$KVER" 2>&1 | grep -v unsandboxed || true)
        for d in "$W"/debs/linux-headers-*.deb "$W"/debs/linux-kbuild-*.deb; do dpkg -x "$d" "$K"; done
        # The headers' Makefile includes the common tree by an absolute path.
        sed -i "s#^include /usr/src/#include $K/usr/src/#" "$H/Makefile"
    fi
    say "kernel headers ready"
}

# Builds kmod/ugds_drv.ko against the guest kernel (warnings are errors);
# prints its path.
build_module() {
    rm -rf "$W/kmod" && mkdir -p "$W/kmod" && cp "$ROOT"/kmod/{Makefile,*.c,*.h} "$W/kmod/"
    make -s -C "$K/usr/src/linux-headers-$KV" M="$W/kmod" modules >&2
    echo "$W/kmod/ugds_drv.ko"
}

# Builds and installs ugds_drv for the guest kernel through DKMS, as on a
# user's machine (`scripts/install --module`, against the guest kernel's
# headers); prints the installed module's path (decompressed where DKMS
# compressed it as the kernel's configuration asks).
dkms_module() {
    if ! command -v dkms >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends dkms >/dev/null
    fi
    # The guest kernel as installed on a machine: its modules directory
    # with the headers at `build` (where DKMS looks for them).
    mkdir -p "/lib/modules/$KV" && ln -sfn "$K/usr/src/linux-headers-$KV" "/lib/modules/$KV/build"
    "$ROOT/scripts/install" --module "$KV" >&2 || return 1
    local ko=/lib/modules/$KV/updates/dkms/ugds_drv.ko
    if [ ! -e "$ko" ] && [ -e "$ko.xz" ]; then
        xz -dc "$ko.xz" >"$W/ugds_drv-dkms.ko" && ko=$W/ugds_drv-dkms.ko
    fi
    [ -e "$ko" ] || { echo "DKMS installed no ugds_drv.ko for $KV" >&2; return 1; }
    echo "$ko"
}

# Builds kmod/ugds_drv.ko once more with its nvidia_p2p option, against the
# headers of NVIDIA's open kernel modules from Debian's contrib archive (a
# compile check: there is no NVIDIA driver to link against or load here, so
# modpost is told to only warn about the nvidia_p2p_* symbols).
build_module_p2p() {
    local A=$W/nvapt NV=$W/nvapt/src/modules/nvidia-open-kernel
    if [ ! -e "$NV/nvidia/nv-p2p.h" ]; then
        mkdir -p "$A/lists/partial" "$A/cache/archives/partial" "$A/src"
        echo "deb http://deb.debian.org/debian bookworm contrib non-free" > "$A/sources.list"
        local o=(-o Dir::Etc::SourceList="$A/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o Dir::State::Lists="$A/lists" -o Dir::Cache="$A/cache")
        apt-get "${o[@]}" update -qq >/dev/null
        (cd "$A" && apt-get "${o[@]}" download -qq nvidia-open-kernel-source 2>&1 | grep -v unsandboxed || true)
        dpkg -x "$A"/nvidia-open-kernel-source_*.deb "$A/deb"
        tar -xJf "$A/deb/usr/src/nvidia-open-kernel.tar.xz" -C "$A/src" \
            modules/nvidia-open-kernel/nvidia/nv-p2p.h
    fi
    rm -rf "$W/kmod-p2p" && mkdir -p "$W/kmod-p2p" && cp "$ROOT"/kmod/{Makefile,*.c,*.h} "$W/kmod-p2p/"
    make -s -C "$K/usr/src/linux-headers-$KV" M="$W/kmod-p2p" NVIDIA_SRC="$NV" KBUILD_MODPOST_WARN=1 \
        modules 2>&1 | grep -v 'WARNING: modpost: "nvidia_p2p_' >&2 || true
    [ -e "$W/kmod-p2p/ugds_drv.ko" ]
}

# build_kernel NAME FRAGMENT [keep]: Debian's linux-source-6.12, tinyconfig
# plus FRAGMENT (every option checked taken), built once into $W/NAME-kernel
# (bzImage, version, and with `keep` the built tree in src/ for modules).
build_kernel() {
    local name=$1 frag=$2 keep=${3:-}
    local B=$W/$name-kernel
    local stamp; stamp=$(sha256sum "$frag" | cut -c1-16)
    if [ -e "$B/bzImage" ] && [ "$(cat "$B/stamp" 2>/dev/null)" = "$stamp" ]; then
        say "$name kernel ready ($(cat "$B/version"))"
        return
    fi
    local need=()
    for c in flex bison bc make gcc; do command -v $c >/dev/null || need+=("$c"); done
    [ -e /usr/include/libelf.h ] || need+=(libelf-dev)
    if [ ${#need[@]} -gt 0 ]; then
        local inst=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" libc6-dev perl)
        "${inst[@]}" >/dev/null || { apt-get update -qq && "${inst[@]}" >/dev/null; }
    fi
    rm -rf "$B" && mkdir -p "$B/deb"
    (cd "$B" && apt-get download -qq linux-source-6.12 2>&1 | grep -v unsandboxed || true)
    dpkg -x "$B"/linux-source-6.12_*.deb "$B/deb"
    tar -xJf "$B"/deb/usr/src/linux-source-6.12.tar.xz -C "$B"
    local S=$B/linux-source-6.12
    make -s -C "$S" tinyconfig >/dev/null
    (cd "$S" && KCONFIG_CONFIG=.config scripts/kconfig/merge_config.sh -m -Q .config "$frag" >/dev/null)
    make -s -C "$S" olddefconfig >/dev/null
    local missing; missing=$(grep '^CONFIG_' "$frag" | while read -r l; do grep -qx "$l" "$S/.config" || echo "${l%%=*}"; done)
    [ -z "$missing" ] || { echo "$name kernel: options not taken: $missing"; return 1; }
    say "building the $name kernel ($(make -s -C "$S" kernelversion))"
    if [ -n "$keep" ]; then
        make -s -C "$S" -j"$(nproc)" bzImage modules >/dev/null
        mv "$S" "$B/src"
        S=$B/src
    else
        make -s -C "$S" -j"$(nproc)" bzImage >/dev/null
    fi
    cp "$S/arch/x86/boot/bzImage" "$B/bzImage"
    make -s -C "$S" kernelversion > "$B/version"
    [ -n "$keep" ] || rm -rf "$S"
    rm -rf "$B/deb" "$B"/linux-source-6.12_*.deb
    echo "$stamp" > "$B/stamp"
    say "$name kernel ready ($(cat "$B/version"))"
}

# A kernel with iommufd and the vfio cdev, for the iommufd configuration
# (about 7 minutes on 2 cores).
IOMMUFD_KERNEL=$W/iommufd-kernel/bzImage
ensure_iommufd_kernel() {
    build_kernel iommufd "$ROOT/scripts/qemu/iommufd.config"
}

# The debug kernel (KASAN, lockdep, DMA-API debugging, kmemleak) and
# ugds_drv built against it, for the debug configuration.
DEBUG_KERNEL=$W/debug-kernel/bzImage
ensure_debug_kernel() {
    build_kernel debug "$ROOT/scripts/qemu/debug.config" keep
}

# build_module_debug: kmod/ugds_drv.ko against the debug kernel's tree.
build_module_debug() {
    rm -rf "$W/kmod-debug" && mkdir -p "$W/kmod-debug" && cp "$ROOT"/kmod/{Makefile,*.c,*.h} "$W/kmod-debug/"
    make -s -C "$W/debug-kernel/src" M="$W/kmod-debug" modules >&2
    echo "$W/kmod-debug/ugds_drv.ko"
}

# build_p2p_debug: the NVIDIA driver's test stand-in (kmod/test/nv_p2p_fake.c,
# against nv-p2p.h as build_module_p2p fetched it) and ugds_drv with its
# nvidia_p2p option linked against the stand-in's symbols, both against the
# debug kernel's tree; prints both paths (the second named ugds_drv_p2p.ko).
build_p2p_debug() {
    local NV=$W/nvapt/src/modules/nvidia-open-kernel F=$W/nvfake-debug S=$W/nvsrc-debug P=$W/kmod-debug-p2p
    rm -rf "$F" "$S" "$P" && mkdir -p "$F" "$S/nvidia" "$P"
    cp "$ROOT"/kmod/test/{Makefile,*.c} "$F/"
    make -s -C "$W/debug-kernel/src" M="$F" NVIDIA_SRC="$NV" modules >&2
    cp "$NV/nvidia/nv-p2p.h" "$S/nvidia/" && cp "$F/Module.symvers" "$S/"
    cp "$ROOT"/kmod/{Makefile,*.c,*.h} "$P/"
    make -s -C "$W/debug-kernel/src" M="$P" NVIDIA_SRC="$S" modules >&2
    mv "$P/ugds_drv.ko" "$P/ugds_drv_p2p.ko"
    echo "$F/nv_p2p_fake.ko $P/ugds_drv_p2p.ko"
}

# build_static PACKAGE...: static release builds of binary packages.
build_static() {
    local args=()
    for p in "$@"; do args+=(-p "$p"); done
    RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --locked --quiet --target $TGT "${args[@]}"
}

# build_static_test PACKAGE TEST: an integration test binary, built static;
# prints its path.
build_static_test() {
    local pkg=$1 test=$2
    RUSTFLAGS='-C target-feature=+crt-static' cargo test --release --locked --quiet --no-run --target $TGT \
        -p "$pkg" --test "$test" --message-format=json \
        | TEST=$test python3 -c 'import sys,json,os
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]==os.environ["TEST"]: print(m["executable"])' | tail -1
}

# make_initramfs INIT OUT [FILE...]: busybox, the nvme/vfio/ext4 module closure,
# INIT as /init, and guest-lib.sh (what every /init sources) and each FILE in /bin.
make_initramfs() {
    local init=$1 out=$2; shift 2
    local I=$W/initramfs.$$
    rm -rf "$I" && mkdir -p "$I"/{bin,dev,proc,sys,mods,tmp}
    cp /bin/busybox "$I/bin/busybox"
    for a in sh mount umount cat echo sleep insmod rmmod basename readlink mkdir rmdir rm poweroff ls grep head kill \
        mke2fs unshare mkswap swapon swapoff losetup truncate ip ln dmesg tail dd seq; do
        ln -s busybox "$I/bin/$a"
    done
    # File-system tools for the binding steps (and EXTRA_TOOLS, by name),
    # with the libraries they load.
    local t l
    for t in mkfs.btrfs mkfs.xfs ${EXTRA_TOOLS:-}; do
        t=$(command -v "$t") || continue
        cp "$t" "$I/bin/"
        for l in $(ldd "$t" | grep -o '/[^ ]*'); do
            mkdir -p "$I$(dirname "$l")" && cp -L "$l" "$I$l"
        done
    done
    # EXTRA_FILES: absolute paths copied to the same place (shared
    # libraries loaded at run time, their configuration), with the
    # libraries they need.
    for t in ${EXTRA_FILES:-}; do
        mkdir -p "$I$(dirname "$t")" && cp -L "$t" "$I$t"
        case $t in *.so*)
            for l in $(ldd "$t" | grep -o '/[^ ]*'); do
                mkdir -p "$I$(dirname "$l")" && cp -L "$l" "$I$l"
            done ;;
        esac
    done
    local MD=$K/lib/modules/$KV
    declare -A seen=(); local order=()
    resolve() {
        local rel=$1; [[ -n ${seen[$rel]:-} ]] && return; seen[$rel]=1
        local deps; deps=$(grep -E "^${rel//+/\\+}:" "$MD/modules.dep" | cut -d: -f2)
        for d in $deps; do resolve "$d"; done
        order+=("$rel")
    }
    for m in nvme vfio vfio-pci vfio_iommu_type1 ext4 crc32c_generic crc32c-intel loop btrfs xfs nvmet \
        nvmet-tcp nvme-tcp target_core_iblock ${EXTRA_MODULES:-}; do
        local rel; rel=$(grep -E "/${m}\.ko(\.xz|\.zst)?:" "$MD/modules.dep" | cut -d: -f1 || true)
        [[ -n $rel ]] && resolve "$rel"
    done
    : > "$I/mods/order"
    for rel in "${order[@]}"; do
        local b; b=$(basename "$rel"); b=${b%.xz}; b=${b%.zst}
        case $rel in *.xz) xz -dc "$MD/$rel" > "$I/mods/$b";; *.zst) zstd -qdc "$MD/$rel" > "$I/mods/$b";; *) cp "$MD/$rel" "$I/mods/$b";; esac
        echo "$b" >> "$I/mods/order"
    done
    for f in "$ROOT/scripts/qemu/guest-lib.sh" "$@"; do cp "$f" "$I/bin/"; done
    cp "$init" "$I/init"; chmod +x "$I/init"
    (cd "$I" && find . | cpio -o -H newc --quiet | gzip -1) > "$out"
    rm -rf "$I"
}

# controller_args CONFIG IMG1 IMG2: QEMU arguments for one configuration.
#   default  one 512-byte-block namespace, QEMU's defaults (mdts 7, mqes 2047, 64 queues)
#   small    mdts=2 (16 KiB), mqes=15, max_ioqpairs=2
#   4k       4096-byte logical blocks; msix_qsize=2 (I/O queues share vector 1)
#   twons    two namespaces
#   onequeue max_ioqpairs=1, msix_qsize=1: one I/O queue pair for every API, its
#            interrupts on the admin queue's vector
#   iommufd  as default, booted on the iommufd kernel (vfio cdev)
#   debug    as default, booted on the debug kernel (KASAN, lockdep, DMA-API debug, kmemleak)
#   null     a null namespace (no data kept, reads return zeros)
#   tcp      no controller: nvmet exports a namespace over NVMe/TCP on loopback
#   rdma     no controller: soft RoCE, nvmet-rdma and the kernel's nvme-rdma
#   volume   three controllers: two under an emulated PCIe switch (x3130
#            upstream port, two xio3130 downstream ports) below one root port,
#            the third on a root port of its own
controller_args() {
    local cfg=$1 img1=$2 img2=$3 img3=${4:-}
    case $cfg in
        default) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-default,drive=nvm1" ;;
        small) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-small,drive=nvm1,mdts=2,mqes=15,max_ioqpairs=2" ;;
        4k) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,id=nvme0,serial=ugds-4k,msix_qsize=2 -device nvme-ns,drive=nvm1,bus=nvme0,nsid=1,logical_block_size=4096,physical_block_size=4096" ;;
        twons) echo "-drive file=$img1,if=none,id=nvm1,format=raw -drive file=$img2,if=none,id=nvm2,format=raw -device nvme,id=nvme0,serial=ugds-twons -device nvme-ns,drive=nvm1,bus=nvme0,nsid=1 -device nvme-ns,drive=nvm2,bus=nvme0,nsid=2" ;;
        zoned) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,id=nvme0,serial=ugds-zoned -device nvme-ns,drive=nvm1,bus=nvme0,nsid=1,zoned=true,zoned.zone_size=4M,zoned.zone_capacity=4M" ;;
        tiny) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-tiny,drive=nvm1,mdts=1,mqes=1" ;;
        onequeue) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-onequeue,drive=nvm1,max_ioqpairs=1,msix_qsize=1" ;;
        iommufd) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-iommufd,drive=nvm1" ;;
        debug) echo "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-debug,drive=nvm1" ;;
        null) echo "-drive driver=null-co,read-zeroes=on,if=none,id=nvm1 -device nvme,serial=ugds-null,drive=nvm1" ;;
        tcp | rdma) echo "" ;;
        volume) echo "-device pcie-root-port,id=rp1,bus=pcie.0,chassis=1,slot=1 -device x3130-upstream,id=up1,bus=rp1" \
            "-device xio3130-downstream,id=dn1,bus=up1,chassis=2,slot=0 -device xio3130-downstream,id=dn2,bus=up1,chassis=3,slot=0" \
            "-device pcie-root-port,id=rp2,bus=pcie.0,chassis=4,slot=2" \
            "-drive file=$img1,if=none,id=nvm1,format=raw -device nvme,serial=ugds-vol0,drive=nvm1,bus=dn1" \
            "-drive file=$img2,if=none,id=nvm2,format=raw -device nvme,serial=ugds-vol1,drive=nvm2,bus=dn2" \
            "-drive file=$img3,if=none,id=nvm3,format=raw -device nvme,serial=ugds-vol2,drive=nvm3,bus=rp2" ;;
        *) return 1 ;;
    esac
}

# run_guest CONFIG INITRD CONSOLE TRACE [APPEND]: boots once; returns QEMU's
# status. The iommufd configuration boots the iommufd kernel, the others
# Debian's.
run_guest() {
    local cfg=$1 initrd=$2 con=$3 tr=$4 append=${5:-}
    local img1=$W/$cfg-ns1.img img2=$W/$cfg-ns2.img img3=$W/$cfg-ns3.img
    rm -f "$img1" "$img2" "$img3" "$tr"; truncate -s 64M "$img1"; truncate -s 64M "$img2"
    [ "$cfg" = volume ] && truncate -s 64M "$img3"
    local dev; dev=$(controller_args "$cfg" "$img1" "$img2" "$img3") || { echo "unknown configuration $cfg"; return 2; }
    local kernel=$K/boot/vmlinuz-$KV
    [ "$cfg" = iommufd ] && kernel=$IOMMUFD_KERNEL
    # The checkers report at warning level, which `quiet` would hide.
    [ "$cfg" = debug ] && kernel=$DEBUG_KERNEL append="$append ignore_loglevel"
    # shellcheck disable=SC2086
    timeout "${QEMU_TIMEOUT:-180}" qemu-system-x86_64 -machine q35 -accel tcg -m 1G -smp "${QEMU_SMP:-2}" -nographic -no-reboot -nic none \
        -device intel-iommu -kernel "$kernel" -initrd "$initrd" \
        -append "console=ttyS0 panic=-1 quiet intel_iommu=on ugds.config=$cfg $append" $dev \
        -trace 'pci_nvme_err*' -trace 'pci_nvme_ub*' -D "$tr" > "$con" 2>&1
}
