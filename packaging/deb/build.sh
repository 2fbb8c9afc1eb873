#!/bin/sh
# build.sh VERSION BINDIR DISTDIR
#
# Builds relayd_VERSION_amd64.deb and relayd-tools_VERSION_amd64.deb in
# DISTDIR from the binaries in BINDIR (relayd, relayctl, voipgen) with
# dpkg-deb over staged trees. Depends come from dpkg-shlibdeps on the
# binaries (libc6 when cgo is in use, nothing for a static build).
set -eu

version=$1
bindir=$(cd "$2" && pwd)
mkdir -p "$3"
dist=$(cd "$3" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
cd "$top"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# Reproducible: file times and the changelog date are the commit's.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
export SOURCE_DATE_EPOCH
maintainer=${DEB_MAINTAINER:-$(git log -1 --format='%cn <%ce>')}
date=$(date -u -R -d "@$SOURCE_DATE_EPOCH")
commit=$(git rev-parse --short=12 HEAD)

# gz FILE DEST: gzip -9n, as dh_compress does.
gz() { install -d "$(dirname "$2")"; gzip -9nc "$1" > "$2"; chmod 0644 "$2"; }

# license DIR: the SPDX-ish name of the license file in a module's source.
license() {
	f=$(ls "$1"/LICENSE* "$1"/LICENCE* "$1"/COPYING* "$1"/License* 2>/dev/null | head -n1)
	if [ -z "$f" ]; then echo "see the module's source"; return; fi
	if grep -q 'Apache License' "$f" && grep -q 'Version 2.0' "$f"; then echo Apache-2.0
	elif grep -q 'Permission is hereby granted, free of charge' "$f"; then echo Expat
	elif grep -q 'Mozilla Public License' "$f"; then echo MPL-2.0
	elif grep -q 'SIL OPEN FONT LICENSE' "$f"; then echo OFL-1.1
	elif grep -q 'Permission to use, copy, modify, and/or distribute' "$f"; then echo ISC
	elif grep -q 'Redistribution and use' "$f" && grep -qi 'neither the name\|names of its contributors' "$f"; then echo BSD-3-clause
	elif grep -q 'Redistribution and use' "$f"; then echo BSD-2-clause
	elif grep -q 'FreeType Project\|FreeType License' "$f"; then echo "FTL or GPL-2+"
	elif grep -q 'Creative Commons Attribution 4.0' "$f"; then echo CC-BY-4.0
	else echo "see $(basename "$f") in the module's source"; fi
}

# copyright PACKAGE CMD...: the DEP-5 file with the third-party Go modules
# the commands link, one per line of the header's Comment. relayd's own
# modules (github.com/relayd/relayd and .../voipgen) are the Files: * stanza:
# in the workspace both are main modules, and the path test keeps them out
# should voipgen ever be built against a required relayd instead.
copyright() {
	pkg=$1; shift
	mods=$(go list -deps -f '{{with .Module}}{{if not .Main}}{{.Path}} {{.Version}} {{.Dir}}{{end}}{{end}}' "$@" | sort -u |
		while read -r path ver dir; do
			case $path in github.com/relayd/relayd | github.com/relayd/relayd/*) continue ;; esac
			echo " $path $ver: $(license "$dir")"
		done)
	awk -v pkg="$pkg" -v mods="$mods" '{ gsub(/@PACKAGE@/, pkg); if ($0 == "@MODULES@") print mods; else print }' "$here/copyright.in"
}

# changelog PACKAGE: changelog.Debian for this build.
changelog() {
	cat <<EOC
$1 ($version) unstable; urgency=medium

  * Built from relayd commit $commit.

 -- $maintainer  $date
EOC
}

# depends BINARY...: dpkg-shlibdeps' answer, in a scratch debian/ tree.
depends() {
	d=$work/shlibs
	rm -rf "$d"; mkdir -p "$d/debian"
	printf 'Source: relayd\n\nPackage: relayd\nArchitecture: amd64\n' > "$d/debian/control"
	(cd "$d" && dpkg-shlibdeps -O "$@" 2>/dev/null) | sed -n 's/^shlibs:Depends=//p'
}

# control PACKAGE ROOT DEPENDS DESCRIPTION: DEBIAN/control and md5sums.
control() {
	pkg=$1 root=$2 deps=$3 desc=$4
	size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
	{
		echo "Package: $pkg"
		echo "Version: $version"
		echo "Architecture: amd64"
		echo "Maintainer: $maintainer"
		echo "Installed-Size: $size"
		[ -n "$deps" ] && echo "Depends: $deps"
		echo "Section: net"
		echo "Priority: optional"
		echo "Homepage: https://github.com/relayd/relayd"
		printf '%s\n' "$desc"
	} > "$root/DEBIAN/control"
	(cd "$root" && find . -type f ! -path './DEBIAN/*' | LC_ALL=C sort | sed 's|^\./||' | xargs md5sum) > "$root/DEBIAN/md5sums"
	chmod 0644 "$root/DEBIAN/control" "$root/DEBIAN/md5sums"
	find "$root" -newermt "@$SOURCE_DATE_EPOCH" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
	dpkg-deb --root-owner-group -Zxz --build "$root" "$dist/${pkg}_${version}_amd64.deb" >/dev/null
	echo "$dist/${pkg}_${version}_amd64.deb"
}

umask 022

# strip BINARY...: what dh_strip removes besides symbols (go build -s -w
# already left none): the toolchain's comment and note sections.
strip_extra() { strip --remove-section=.comment --remove-section=.note "$@"; }

# relayd: the daemon, relayctl, the unit and its snippets.
r=$work/relayd
install -d "$r/DEBIAN"
install -D -m 0755 "$bindir/relayd" "$r/usr/bin/relayd"
install -D -m 0755 "$bindir/relayctl" "$r/usr/bin/relayctl"
strip_extra "$r/usr/bin/relayd" "$r/usr/bin/relayctl"
install -D -m 0644 systemd/relayd.service "$r/lib/systemd/system/relayd.service"
install -D -m 0644 systemd/relayd.toml "$r/etc/relayd/relayd.toml"
install -D -m 0644 systemd/relayd-sysctl.conf "$r/usr/lib/sysctl.d/60-relayd.conf"
install -D -m 0644 systemd/relayd-tmpfiles.conf "$r/usr/lib/tmpfiles.d/relayd.conf"
install -D -m 0644 "$here/relayd.lintian-overrides" "$r/usr/share/lintian/overrides/relayd"
doc=$r/usr/share/doc/relayd
install -D -m 0644 README.md "$doc/README.md"
for f in docs/api.md docs/routing.md docs/architecture.md docs/ng.md docs/state.md; do
	# dh_compress: documentation over 4 kB is compressed.
	if [ "$(stat -c %s "$f")" -gt 4096 ]; then gz "$f" "$doc/$(basename "$f").gz"; else install -m 0644 "$f" "$doc/"; fi
done
copyright relayd ./cmd/relayd ./cmd/relayctl > "$doc/copyright"
changelog relayd > "$work/changelog"; gz "$work/changelog" "$doc/changelog.Debian.gz"
gz docs/man/relayd.8 "$r/usr/share/man/man8/relayd.8.gz"
gz docs/man/relayctl.1 "$r/usr/share/man/man1/relayctl.1.gz"
gz docs/man/relayd.toml.5 "$r/usr/share/man/man5/relayd.toml.5.gz"
install -m 0755 "$here/relayd/postinst" "$here/relayd/prerm" "$here/relayd/postrm" "$r/DEBIAN/"
echo /etc/relayd/relayd.toml > "$r/DEBIAN/conffiles"
chmod 0644 "$r/DEBIAN/conffiles"
deps=$(depends "$r/usr/bin/relayd" "$r/usr/bin/relayctl")
# nft: relayd -prepare loads the forward-drop rule with it; procps: the
# unit's ExecReload= runs /bin/kill.
deps="${deps:+$deps, }nftables, procps"
control relayd "$r" "$deps" "Description: VoIP media relay with an XDP fast path and a SIP B2BUA
 relayd anchors the media of VoIP calls and relays plain RTP and RTCP in an
 XDP program (addresses and ports rewritten, checksums updated, RFC 3550
 statistics per flow), with a pool of user-space workers for SRTP,
 symmetric RTP latching and what XDP does not forward. It is also a SIP
 back-to-back user agent that routes calls and anchors their media. Calls
 keep their media across daemon restarts: the XDP state is pinned.
 .
 This package holds the daemon, relayctl (the admin API's command line) and
 the systemd unit. The packaged configuration attaches to nothing until
 edited."

# relayd-tools: voipgen, for test machines.
t=$work/relayd-tools
install -d "$t/DEBIAN"
install -D -m 0755 "$bindir/voipgen" "$t/usr/bin/voipgen"
strip_extra "$t/usr/bin/voipgen"
install -D -m 0644 "$here/relayd-tools.lintian-overrides" "$t/usr/share/lintian/overrides/relayd-tools"
tdoc=$t/usr/share/doc/relayd-tools
install -d "$tdoc"
copyright relayd-tools ./voipgen/cmd/voipgen > "$tdoc/copyright"
changelog relayd-tools > "$work/changelog"; gz "$work/changelog" "$tdoc/changelog.Debian.gz"
gz docs/man/voipgen.1 "$t/usr/share/man/man1/voipgen.1.gz"
control relayd-tools "$t" "$(depends "$t/usr/bin/voipgen")" "Description: VoIP traffic generator and lab benchmark for relayd
 voipgen sends and receives RTP expressed as calls, codec and call
 duration, places and answers SIP calls with media, and measures loss,
 jitter and gaps; it also runs relayd's network-namespace benchmarks.
 .
 A test tool: install it on test machines, not on a production relay."
