#!/bin/sh
# guest.sh SHARE: the appliance test inside the Debian 12 guest, run by
# relayd-vmtest.service with systemd as PID 1. SHARE (9p from the host)
# holds relayd_*.deb and relayd-tools_*.deb; the script writes there:
#   results   one line per check: "NAME ok" or "NAME FAIL"
#   figures   key=value measurements
#   caps      one line per capability of the unit: what fails without it
#   guest.log everything the checks printed
#   status    0 when every check passed, written last
#
# Each check is a shell function run by `check NAME FUNCTION`; a function
# fails by returning non-zero (say why on stderr first). Checks run in
# order and later ones may rely on earlier ones (the topology, a running
# relayd). Add a check: write the function, add a `check` line below.
set -u
share=$1
results=$share/results
figures=$share/figures
caps=$share/caps
: > "$results"
: > "$figures"
: > "$caps"
exec >> "$share/guest.log" 2>&1
failed=0
config=/etc/relayd/relayd.toml

figure() { echo "$1=$2" >> "$figures"; }
ms() { echo $(( $(date +%s%N) / 1000000 )); }
check() {
	name=$1
	shift
	echo "== $name ($(cut -d' ' -f1 /proc/uptime)s)"
	check_t0=$(ms)
	if "$@"; then
		echo "$name ok" >> "$results"
	else
		echo "$name FAIL" >> "$results"
		failed=1
	fi
	figure "check_${name}_ms" $(( $(ms) - check_t0 ))
}
# must CMD...: run a command, say which one failed.
must() { "$@" || { echo "failed: $*" >&2; return 1; }; }
# journal_since CURSOR: relayd's journal after the cursor, messages only.
journal_since() { journalctl -u relayd --no-pager -o cat --after-cursor="$1"; }
# cursor: the whole journal's (a unit's is empty before its first line).
cursor() { journalctl -n 0 --show-cursor --no-pager | sed -n 's/^-- cursor: //p'; }

# boot: how long the guest took to reach multi-user.target (this unit
# starts after it).
boot() {
	figure guest_boot_to_ready_s "$(cut -d' ' -f1 /proc/uptime)"
	figure guest_kernel "$(uname -r)"
	# Where the boot went: the kernel until it ran the initrd's /init, the
	# initrd until systemd started, systemd until multi-user.target.
	figure guest_kernel_to_init_s "$(dmesg | sed -n 's/^\[ *\([0-9.]*\)\] Run \/init as init process.*/\1/p')"
	us=$(systemctl show -p UserspaceTimestampMonotonic --value)
	mu=$(systemctl show -p ActiveEnterTimestampMonotonic --value multi-user.target)
	figure guest_to_systemd_ms $(( us / 1000 ))
	figure guest_systemd_to_multi_user_ms $(( (mu - us) / 1000 ))
	test "$(systemctl is-system-running 2>/dev/null)" != offline
}

# install: apt installs both packages offline (every dependency is in the
# image); postinst enables relayd and tries to start it, which fails with
# the packaged config without failing the installation.
install_debs() {
	c=$(cursor)
	t0=$(ms)
	must env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
		-o Dpkg::Use-Pty=0 "$share"/relayd_*.deb "$share"/relayd-tools_*.deb || return 1
	figure apt_install_ms $(( $(ms) - t0 ))
	must test "$(systemctl is-enabled relayd)" = enabled || return 1
	must dpkg-query -W -f='${Conffiles}\n' relayd | grep -q "$config" || return 1
	if systemctl is-active --quiet relayd; then
		echo "relayd runs with the packaged config" >&2
		return 1
	fi
	# The refusal names the file and the keys to edit, in the journal and
	# from relayd -check.
	journal_since "$c" | grep "$config" | grep -q dataplane.interfaces || { echo "journal does not name $config and dataplane.interfaces" >&2; return 1; }
	relayd -check -config "$config" 2>&1 | grep "$config" | grep -q "media.address" || { echo "relayd -check does not name media.address" >&2; return 1; }
	must command -v voipgen >/dev/null
}

# topology: caller and callee in network namespaces behind veth pairs,
# relayd in the root namespace as on bare metal:
#   caller c0 198.18.0.2 -- r0 198.18.0.1  lo 198.18.1.1 (media)  r1 198.18.2.1 -- e0 198.18.2.2 callee
#          2001:2::2         2001:2::1      2001:2:0:1::1          2001:2:0:2::1     2001:2:0:2::2
# GRO on and tx checksum offload off on every veth (redirected frames into
# a veth need GRO on its peer; XDP's incremental checksums need full ones).
topology() {
	for ns in caller callee; do must ip netns add $ns || return 1; done
	must ip link add r0 type veth peer name c0 netns caller &&
	must ip link add r1 type veth peer name e0 netns callee || return 1
	for d in r0 r1; do must ethtool -K $d gro on tx off >/dev/null || return 1; done
	must ip netns exec caller ethtool -K c0 gro on tx off >/dev/null &&
	must ip netns exec callee ethtool -K e0 gro on tx off >/dev/null || return 1
	must ip addr add 198.18.0.1/24 dev r0 &&
	must ip addr add 198.18.2.1/24 dev r1 &&
	must ip addr add 198.18.1.1/32 dev lo &&
	must ip addr add 2001:2::1/64 dev r0 nodad &&
	must ip addr add 2001:2:0:2::1/64 dev r1 nodad &&
	must ip addr add 2001:2:0:1::1/128 dev lo &&
	must ip -n caller addr add 2001:2::2/64 dev c0 nodad &&
	must ip -n callee addr add 2001:2:0:2::2/64 dev e0 nodad &&
	must ip link set r0 up && must ip link set r1 up &&
	must ip -n caller addr add 198.18.0.2/24 dev c0 &&
	must ip -n callee addr add 198.18.2.2/24 dev e0 &&
	must ip -n caller link set c0 up && must ip -n caller link set lo up &&
	must ip -n callee link set e0 up && must ip -n callee link set lo up &&
	must ip -n caller route add default via 198.18.0.1 &&
	must ip -n callee route add default via 198.18.2.1 &&
	must ip -n caller -6 route add default via 2001:2::1 &&
	must ip -n callee -6 route add default via 2001:2:0:2::1 &&
	must ip netns exec caller ping -c 1 -W 2 198.18.0.1 >/dev/null &&
	must ip netns exec callee ping -c 1 -W 2 198.18.2.1 >/dev/null
}

# configure: the two keys the packaged config leaves empty, and IPv6.
configure() {
	must sed -i -e 's/^interfaces = \[\]/interfaces = ["r0", "r1"]/' -e 's/^address = ""/address = "198.18.1.1"/' \
		-e '0,/^# address6 = /s/^# address6 = .*/address6 = "2001:2:0:1::1"/' "$config" &&
	must relayd -check -config "$config"
}

# start: systemctl start returns once relayd sent READY=1 (Type=notify).
start() {
	systemctl reset-failed relayd
	t0=$(ms)
	must systemctl start relayd || { systemctl status relayd --no-pager; return 1; }
	figure relayd_start_to_active_ms $(( $(ms) - t0 ))
	must test "$(systemctl is-active relayd)" = active
}

relayctl_works() {
	must relayctl health && must relayctl flows
}

# journal: relayd's lines reach the journal; the redirect monitor runs
# under the unit (its raw tracepoints attached with the unit's capabilities).
journal() {
	journalctl -u relayd --no-pager -o cat | grep -q '"relayd ready"' || { echo "no \"relayd ready\" in journalctl -u relayd" >&2; return 1; }
	if journalctl -u relayd --no-pager -o cat | grep 'redirect failures are not watched' >&2; then return 1; fi
}

# forward_drop: relayd -prepare turned forwarding on for r0 and r1 only and
# dropped transit: the callee's own address is not reachable through the
# relay, the relay's addresses are.
forward_drop() {
	must test "$(cat /proc/sys/net/ipv4/conf/r0/forwarding)" = 1 &&
	must test "$(cat /proc/sys/net/ipv6/conf/r1/forwarding)" = 1 &&
	must test "$(cat /proc/sys/net/ipv4/conf/all/forwarding)" = 0 &&
	must nft list table inet relayd >/dev/null || return 1
	for a in 198.18.2.2 2001:2:0:2::2; do
		if ip netns exec caller ping -c 2 -W 1 $a >/dev/null; then
			echo "caller reaches $a through the relay: transit is forwarded" >&2
			return 1
		fi
	done
	must ip netns exec caller ping -c 1 -W 2 198.18.2.1 >/dev/null
}

# stream MATCH SEND_FROM SEND_TO SRC: a static flow MATCH -> SEND_TO
# (leaving from SEND_FROM), then 250 RTP packets (5 s of G.711) from SRC in
# the caller's namespace to MATCH, received at SEND_TO in the callee's: every
# one must arrive and be counted on the flow's xdp path.
stream() {
	flow=$(relayctl -json flow add --match "$1" --send-from "$2" --send-to "$3") || { echo "flow add $1 failed" >&2; return 1; }
	id=$(echo "$flow" | sed -n 's/^  "id": \([0-9]*\),*$/\1/p')
	ip netns exec callee voipgen recv --listen "$3-${3##*:}" --duration 9s --json > /tmp/recv.json &
	rpid=$!
	sleep 1
	must ip netns exec caller voipgen send --transport udp --src "$4" --dst "$1" --streams 1 --duration 5s >/dev/null || return 1
	wait $rpid
	# The last "packets" of voipgen's one-line JSON is the total.
	got=$(sed -n 's/.*"packets":\([0-9]*\).*/\1/p' /tmp/recv.json)
	flow=$(relayctl -json flow get "$id")
	echo "$flow"
	echo "received ${got:-0}"
	received=${got:-0}
	must test "$received" -eq 250 || { cat /tmp/recv.json; return 1; }
	echo "$flow" | grep -q '"path": "xdp"' || { echo "flow $id not on xdp" >&2; return 1; }
	echo "$flow" | grep -q '"packets": 250,' || { echo "flow $id did not count 250 packets" >&2; return 1; }
}

# xdp_media, xdp_media6: RTP through native XDP on r0, redirected to r1.
xdp_media() {
	must relayctl stats | grep -q 'relayd_xdp_attached{interface="r0",mode="native"} 1' || return 1
	stream 198.18.1.1:30000 198.18.1.1:30002 198.18.2.2:5000 198.18.0.2:4000 || return 1
	figure xdp_media_received "$received"
}
xdp_media6() {
	stream '[2001:2:0:1::1]:30004' '[2001:2:0:1::1]:30006' '[2001:2:0:2::2]:5002' '[2001:2::2]:4002' || return 1
	figure xdp_media6_received "$received"
}

# bpffs: with no bpffs on /sys/fs/bpf, the unit still starts: relayd
# -prepare mounts one in the host's mount namespace (so the pins are there,
# outside the service) before relayd runs.
bpffs() {
	must systemctl stop relayd &&
	must relayd -detach -config "$config" >/dev/null 2>&1 &&
	must umount /sys/fs/bpf || return 1
	if findmnt -t bpf /sys/fs/bpf >/dev/null; then echo "bpffs still mounted" >&2; return 1; fi
	must systemctl start relayd &&
	must systemctl is-active --quiet relayd &&
	must findmnt -t bpf /sys/fs/bpf >/dev/null || return 1
	ls -R /sys/fs/bpf/relayd | grep -q . || { echo "nothing pinned under /sys/fs/bpf/relayd" >&2; return 1; }
}

# capabilities: for each capability in the unit, a drop-in that removes it
# (from a fresh start: pinned state detached) must make relayd fail, and
# the first error it logs names what failed. One line per capability in
# $share/caps.
capabilities() {
	all=$(systemctl show -p CapabilityBoundingSet --value relayd)
	[ -n "$all" ] || { echo "no capabilities in the unit" >&2; return 1; }
	dropin=/run/systemd/system/relayd.service.d
	ok=0
	for cap in $all; do
		keep=$(echo "$all" | tr ' ' '\n' | grep -vx "$cap" | tr '\n' ' ')
		mkdir -p $dropin
		printf '[Service]\nRestart=no\nCapabilityBoundingSet=\nCapabilityBoundingSet=%s\nAmbientCapabilities=\nAmbientCapabilities=%s\n' "$keep" "$keep" > $dropin/50-without-cap.conf
		systemctl daemon-reload
		systemctl stop relayd
		relayd -detach -config "$config" >/dev/null 2>&1
		c=$(cursor)
		systemctl reset-failed relayd 2>/dev/null
		if systemctl start relayd && systemctl is-active --quiet relayd; then
			echo "$cap: relayd runs without it (unused)" >> "$caps"
			ok=1
			continue
		fi
		why=$(journal_since "$c" | grep -m 1 '"level":"error"' | sed -n 's/.*"error":"\([^"]*\)".*/\1/p')
		[ -n "$why" ] || why=$(journal_since "$c" | grep -m 1 -i 'error\|not permitted')
		echo "$cap: $why" >> "$caps"
		[ -n "$why" ] || ok=1
	done
	rm -f $dropin/50-without-cap.conf
	systemctl daemon-reload
	systemctl reset-failed relayd
	must systemctl restart relayd && must systemctl is-active --quiet relayd || return 1
	return $ok
}

# upgrade: installing the package again, as an upgrade does, restarts
# relayd (postinst's restart): a new main process, active again. The
# gzip-compressed copy of the package (share/prev): install already
# unpacked the one built, and xz costs 10 s more to unpack under TCG.
upgrade() {
	pid=$(systemctl show -p MainPID --value relayd)
	must env DEBIAN_FRONTEND=noninteractive apt-get install -y --reinstall -o Dpkg::Use-Pty=0 "$share"/prev/relayd_*.deb || return 1
	must systemctl is-active --quiet relayd || return 1
	new=$(systemctl show -p MainPID --value relayd)
	[ "$new" != "$pid" ] || { echo "relayd not restarted (main pid still $pid)" >&2; return 1; }
}

# remove: relayd stopped, XDP taken off the interfaces, the conffile kept.
remove() {
	must env DEBIAN_FRONTEND=noninteractive apt-get remove -y -o Dpkg::Use-Pty=0 relayd || return 1
	if systemctl is-active --quiet relayd; then echo "relayd active after remove" >&2; return 1; fi
	if ip link show r0 | grep -q xdp; then ip link show r0; echo "XDP still attached to r0 after remove" >&2; return 1; fi
	must test -e "$config"
}

# purge: the config, state and log directories gone.
purge() {
	must env DEBIAN_FRONTEND=noninteractive apt-get purge -y -o Dpkg::Use-Pty=0 relayd || return 1
	for p in /etc/relayd /var/lib/relayd /var/log/relayd; do
		if [ -e $p ]; then echo "$p left after purge" >&2; return 1; fi
	done
}

# watchdog: a relayd stopped with SIGSTOP stops petting the watchdog and
# systemd restarts it (WatchdogSec, then SIGKILL after TimeoutStopSec).
watchdog() {
	pid=$(systemctl show -p MainPID --value relayd)
	n=$(systemctl show -p NRestarts --value relayd)
	[ "${pid:-0}" -gt 1 ] || { echo "relayd not running" >&2; return 1; }
	must kill -STOP "$pid" || return 1
	t0=$(ms)
	i=0
	while [ $i -lt 90 ]; do
		sleep 1
		i=$((i + 1))
		new=$(systemctl show -p MainPID --value relayd)
		if [ "$new" != "$pid" ] && [ "$new" != 0 ] && systemctl is-active --quiet relayd; then
			figure watchdog_restart_ms $(( $(ms) - t0 ))
			must test "$(systemctl show -p NRestarts --value relayd)" -gt "$n"
			return
		fi
	done
	echo "relayd (pid $pid, SIGSTOPped) not restarted within 90 s" >&2
	return 1
}

# sip: the B2BUA on the caller side's relay addresses, IPv4 and IPv6, one
# route to the callee; the shipped config keeps calls in
# /var/lib/relayd/state.db.
sip() {
	must grep -q '^path = "/var/lib/relayd/state.db"' "$config" || return 1
	must sed -i '/^\[sip\]/,/^\[/ s|^listen = \[\] .*|listen = ["udp:198.18.0.1:5060", "udp:[2001:2::1]:5060"]|' "$config" || return 1
	cat >> "$config" <<'EOT'
[[route]]
name = "callee6"
match = "^callee6$"
destinations = ["sip:[2001:2:0:2::2]:5060"]
[[route]]
name = "callee"
match = "."
destinations = ["sip:198.18.2.2:5060"]
EOT
	must relayd -check -config "$config" && must systemctl restart relayd && must systemctl is-active --quiet relayd
}

# calls_across NAME ACTION...: two IPv4 calls and one IPv6 call, 24 s of
# G.711 each way, answered by voipgen in the callee namespace, through
# relayd's B2BUA and XDP; ACTION runs 8 s into the calls. Every call must
# complete (BYE from the caller after the action, 200 from the callee
# through the new relayd), no RTP packet may be lost either way, and the
# CDR file gets one complete line per call.
calls_across() {
	act=$1
	shift
	cdrs=$(cat /var/log/relayd/cdr.jsonl 2>/dev/null | wc -l)
	ip netns exec callee voipgen answer --sip 198.18.2.2:5060 --duration 90s --max-calls 2 --json > /tmp/answer4.json 2>/tmp/answer4.err &
	a4=$!
	ip netns exec callee voipgen answer --sip '[2001:2:0:2::2]:5060' --duration 90s --max-calls 1 --json > /tmp/answer6.json 2>/tmp/answer6.err &
	a6=$!
	sleep 2
	ip netns exec caller voipgen call --sip 198.18.0.2:5070 --target sip:callee@198.18.0.1:5060 \
		--calls 2 --rate 4 --call-duration 24s --json > /tmp/call4.json 2>/tmp/call4.err &
	c4=$!
	ip netns exec caller voipgen call --sip '[2001:2::2]:5070' --target 'sip:callee6@[2001:2::1]:5060' \
		--rtp-port 21000 --calls 1 --call-duration 24s --json > /tmp/call6.json 2>/tmp/call6.err &
	c6=$!
	sleep 8
	t0=$(ms)
	"$@" || { echo "$act: the action failed" >&2; kill $c4 $c6 $a4 $a6 2>/dev/null; return 1; }
	# Back when the admin API answers again.
	i=0
	until relayctl health >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 300 ] || { echo "$act: relayd not back within 30 s" >&2; return 1; }
		sleep 0.1
	done
	figure ${act}_back_ms $(( $(ms) - t0 ))
	wait $c4; wait $c6; wait $a4; wait $a6
	ok=0
	for f in /tmp/call4.json /tmp/call6.json /tmp/answer4.json /tmp/answer6.json; do
		echo "$f: $(jq -c .summary "$f")"
		want=2
		case $f in *6.json) want=1 ;; esac
		got=$(jq .summary.succeeded "$f")
		both=$(jq .summary.calls_with_media_both_ways "$f")
		lost=$(jq .summary.lost "$f")
		gap=$(jq .summary.max_gap_ms.max "$f")
		figure "${act}_$(basename "$f" .json)_lost" "$lost"
		figure "${act}_$(basename "$f" .json)_max_gap_ms" "$gap"
		[ "$got" = "$want" ] && [ "$both" = "$want" ] || { echo "$f: $got of $want calls succeeded, $both with media both ways" >&2; ok=1; }
		[ "$lost" = 0 ] || { echo "$f: $lost RTP packets lost across $act" >&2; ok=1; }
	done
	jq -e '[.calls[] | select(.bye_from == "local")] | length == 2' /tmp/call4.json >/dev/null ||
		{ echo "the caller did not end both IPv4 calls with its own BYE" >&2; ok=1; }
	new=$(tail -n +"$((cdrs + 1))" /var/log/relayd/cdr.jsonl 2>/dev/null)
	echo "$new"
	n=$(echo "$new" | jq -s '[.[] | select(.disposition == "answered" and .answer != null and .end != null and (.legs | length) == 2 and (.legs[1].call_id | length) > 0)] | length')
	[ "$n" = 3 ] || { echo "$n complete answered CDRs after $act, want 3" >&2; ok=1; }
	return $ok
}

restart_relayd() { systemctl restart relayd; }
# kill9: SIGKILL; systemd restarts relayd (Restart=on-failure).
kill9() {
	pid=$(systemctl show -p MainPID --value relayd)
	# MainPID 0 (not running) would make kill signal this whole script.
	[ "${pid:-0}" -gt 1 ] || { echo "relayd not running" >&2; return 1; }
	kill -9 "$pid" || return 1
	i=0
	while [ $i -lt 300 ]; do
		new=$(systemctl show -p MainPID --value relayd)
		[ "$new" != "$pid" ] && [ "$new" != 0 ] && return 0
		i=$((i + 1))
		sleep 0.1
	done
	echo "relayd not restarted after SIGKILL" >&2
	return 1
}
# next_version: apt upgrades relayd to the same package with a higher
# version (the host repacked it); postinst restarts relayd.
next_version() {
	env DEBIAN_FRONTEND=noninteractive apt-get install -y -o Dpkg::Use-Pty=0 "$share"/next/relayd_*.deb &&
	dpkg-query -W -f='${Version}\n' relayd | grep -q '+next1$'
}
# previous_version: the rollback, apt installs the version before again
# (the host repacked it as it is, gzip-compressed like next).
previous_version() {
	env DEBIAN_FRONTEND=noninteractive apt-get install -y --allow-downgrades -o Dpkg::Use-Pty=0 "$share"/prev/relayd_*.deb &&
	! dpkg-query -W -f='${Version}\n' relayd | grep -q '+next1$'
}

# journal_err: an error relayd logs (a reload of a config that does not
# parse) reaches the journal at priority err.
journal_err() {
	since=$(date +%s)
	cp "$config" /tmp/relayd.toml.good
	echo 'this is not toml' >> "$config"
	must systemctl reload relayd || return 1
	i=0
	until journalctl -u relayd --no-pager -o cat -p err --since=@"$since" | grep -q 'reload: config not applied'; do
		i=$((i + 1))
		if [ $i -ge 30 ]; then
			cp /tmp/relayd.toml.good "$config"
			echo "no error about the reload in journalctl -u relayd -p err within 15 s; the entries:" >&2
			journalctl -u relayd --no-pager -o json --since=@"$since" | jq -c '{PRIORITY, MESSAGE}' >&2
			return 1
		fi
		sleep 0.5
	done
	cp /tmp/relayd.toml.good "$config"
	must systemctl is-active --quiet relayd
}

# drain: relayctl drain makes a new call get 503 while the call in progress
# goes on until the drain times out, then relayd hangs it up (BYE to both
# sides) with a CDR saying drained. The restart of the next check ends the
# drain (it is not kept across restarts).
drain() {
	cdrs=$(cat /var/log/relayd/cdr.jsonl 2>/dev/null | wc -l)
	ip netns exec callee voipgen answer --sip 198.18.2.2:5060 --duration 60s --max-calls 1 --json > /tmp/danswer.json 2>/tmp/danswer.err &
	a=$!
	sleep 2
	ip netns exec caller voipgen call --sip 198.18.0.2:5070 --target sip:callee@198.18.0.1:5060 \
		--calls 1 --call-duration 40s --json > /tmp/dcall.json 2>/tmp/dcall.err &
	c=$!
	sleep 5
	must relayctl drain --timeout 8s || return 1
	relayctl drain --status
	ip netns exec caller voipgen call --sip 198.18.0.2:5072 --rtp-port 22000 --target sip:callee@198.18.0.1:5060 \
		--calls 1 --json > /tmp/drefused.json 2>/dev/null
	wait $c; wait $a
	ok=0
	jq -e '.calls[0].status == 503' /tmp/drefused.json >/dev/null ||
		{ echo "a call during the drain got $(jq .calls[0].status /tmp/drefused.json), want 503" >&2; ok=1; }
	jq -e '.calls[0].success and .calls[0].bye_from == "remote" and .calls[0].duration_s < 30' /tmp/dcall.json >/dev/null ||
		{ echo "the call in progress was not ended by relayd at the drain timeout: $(jq -c .calls[0] /tmp/dcall.json)" >&2; ok=1; }
	# relayd writes CDRs in batches (cdr.fsync_interval): poll for it, up
	# to 10 s, rather than read once right after the call ended.
	i=0
	while :; do
		d=$(tail -n +"$((cdrs + 1))" /var/log/relayd/cdr.jsonl | jq -s '[.[] | select(.disposition == "drained")] | length')
		[ "$d" = 1 ] || [ $i -ge 100 ] && break
		i=$((i + 1))
		sleep 0.1
	done
	[ "$d" = 1 ] || { echo "$d CDRs with disposition drained, want 1" >&2; tail -n +"$((cdrs + 1))" /var/log/relayd/cdr.jsonl | jq -c '{disposition, reason}' >&2; ok=1; }
	return $ok
}

check boot boot
check install install_debs
check topology topology
check configure configure
check start start
check relayctl relayctl_works
check journal journal
check forward_drop forward_drop
check xdp_media xdp_media
check xdp_media6 xdp_media6
check capabilities capabilities
check bpffs bpffs
check watchdog watchdog
check sip sip
check calls_across_restart calls_across restart restart_relayd
check calls_across_kill9 calls_across kill9 kill9
check calls_across_upgrade calls_across upgrade next_version
check calls_across_rollback calls_across rollback previous_version
check journal_err journal_err
check drain drain
journalctl -u relayd --no-pager -o cat > "$share/relayd.journal"
check upgrade upgrade
check remove remove
check purge purge

echo $failed > "$share/status"
