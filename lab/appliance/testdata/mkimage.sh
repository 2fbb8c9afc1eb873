#!/bin/sh
# mkimage.sh DIR PACKAGE...
#
# Builds a Debian 12 root tree in DIR (which must not exist) with mmdebstrap,
# using the build machine's apt sources, and prepares it for the appliance
# test: systemd as PID 1, the share mounted on /mnt/share over 9p, and
# relayd-vmtest.service, which runs /mnt/share/guest.sh and powers off.
# The kernel and initrd end up in DIR/boot. Run as root.
set -eu

dir=$1
shift
here=$(cd "$(dirname "$0")" && pwd)

# --variant=apt: Essential plus apt; everything else is named. The
# recommends stay out, as on a minimal server install.
#
# What makes the guest boot and build faster under TCG without changing
# what the test checks:
# - dpkg skips its fsyncs while the tree is built (a scratch tree) and
#   leaves out documentation, translations and the kernel modules of
#   hardware the guest has not (sound, GPUs, media, wireless and wired
#   NICs, InfiniBand, IIO, staging): a smaller tree for mkfs.ext4 -d. The
#   dpkg settings are removed at the end: in the guest dpkg runs as
#   installed.
# - the initrd holds only what mounts the root (virtio_pci, virtio_blk,
#   ext4; MODULES=list and a hook), not MODULES=most: under TCG the kernel
#   unpacks a 36 MB initrd, and its udev loads modules, for many seconds.
#   The real root's udev loads the rest (9p, veth...) as on any install.
# - the gettys (no one logs in) are masked with the timers.
include=$(echo "$@" | tr ' ' ',')
set -f # the path-exclude patterns are the guest's, not to be expanded here
exclude=
for p in /usr/share/doc/* /usr/share/man/* /usr/share/locale/* /usr/share/info/*; do
	exclude="$exclude --dpkgopt=path-exclude=$p"
done
for d in sound drivers/gpu drivers/media drivers/net/wireless drivers/net/ethernet drivers/infiniband drivers/iio drivers/staging; do
	exclude="$exclude --dpkgopt=path-exclude=/usr/lib/modules/*/kernel/$d/* --dpkgopt=path-exclude=/lib/modules/*/kernel/$d/*"
done
# shellcheck disable=SC2086 # $exclude is a list of options
mmdebstrap --variant=apt --include="$include" \
	--dpkgopt=force-unsafe-io $exclude \
	--essential-hook='mkdir -p "$1/etc/initramfs-tools/conf.d" "$1/etc/initramfs-tools/hooks" && echo MODULES=list > "$1/etc/initramfs-tools/conf.d/relayd-vm"' \
	--essential-hook="cp '$here/initramfs-hook' \"\$1/etc/initramfs-tools/hooks/relayd-vm\" && chmod 0755 \"\$1/etc/initramfs-tools/hooks/relayd-vm\"" \
	--customize-hook='echo relayd-vm > "$1/etc/hostname"' \
	--customize-hook='printf "/dev/vda / ext4 rw,errors=remount-ro 0 0\nshare /mnt/share 9p trans=virtio,version=9p2000.L,msize=262144,nofail 0 0\n" > "$1/etc/fstab"' \
	--customize-hook='mkdir -p "$1/mnt/share"' \
	--customize-hook="cp '$here/relayd-vmtest.service' \"\$1/etc/systemd/system/\"" \
	--customize-hook='mkdir -p "$1/etc/systemd/system/multi-user.target.wants" && ln -s ../relayd-vmtest.service "$1/etc/systemd/system/multi-user.target.wants/"' \
	--customize-hook='for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer getty@tty1.service getty-static.service serial-getty@ttyS0.service; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
	--customize-hook='rm -f "$1/etc/machine-id" && : > "$1/etc/machine-id"' \
	--customize-hook='rm -f "$1/etc/dpkg/dpkg.cfg.d/99mmdebstrap"' \
	bookworm "$dir"
set +f
ls "$dir"/boot/vmlinuz-* "$dir"/boot/initrd.img-* >/dev/null
