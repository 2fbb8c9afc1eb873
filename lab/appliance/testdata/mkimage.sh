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
include=$(echo "$@" | tr ' ' ',')
mmdebstrap --variant=apt --include="$include" \
	--customize-hook='echo relayd-vm > "$1/etc/hostname"' \
	--customize-hook='printf "/dev/vda / ext4 rw,errors=remount-ro 0 0\nshare /mnt/share 9p trans=virtio,version=9p2000.L,msize=262144,nofail 0 0\n" > "$1/etc/fstab"' \
	--customize-hook='mkdir -p "$1/mnt/share"' \
	--customize-hook="cp '$here/relayd-vmtest.service' \"\$1/etc/systemd/system/\"" \
	--customize-hook='mkdir -p "$1/etc/systemd/system/multi-user.target.wants" && ln -s ../relayd-vmtest.service "$1/etc/systemd/system/multi-user.target.wants/"' \
	--customize-hook='for u in apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer getty@tty1.service; do ln -sf /dev/null "$1/etc/systemd/system/$u"; done' \
	--customize-hook='rm -f "$1/etc/machine-id" && : > "$1/etc/machine-id"' \
	bookworm "$dir"
ls "$dir"/boot/vmlinuz-* "$dir"/boot/initrd.img-* >/dev/null
