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
	# The XDP route cache follows relayd's namespace without setns, which
	# the unit refuses.
	journalctl -u relayd --no-pager -o cat | grep -q '"route cache on"' || { echo "no \"route cache on\" in journalctl -u relayd" >&2; return 1; }
	if journalctl -u relayd --no-pager -o cat | grep 'route cache off' >&2; then return 1; fi
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
		if ip netns exec caller ping -c 2 -i 0.2 -W 1 $a >/dev/null; then
			echo "caller reaches $a through the relay: transit is forwarded" >&2
			return 1
		fi
	done
	must ip netns exec caller ping -c 1 -W 2 198.18.2.1 >/dev/null
}

# stream MATCH SEND_FROM SEND_TO SRC: a static flow MATCH -> SEND_TO
# (leaving from SEND_FROM), then 250 RTP packets (5 s of G.711) from SRC in
# the caller's namespace to MATCH, received at SEND_TO in the callee's: every
# one must arrive and be counted on the flow's xdp path. The receiver
# stops 2 s after the last packet (or at 12 s).
stream() {
	flow=$(relayctl -json flow add --match "$1" --send-from "$2" --send-to "$3") || { echo "flow add $1 failed" >&2; return 1; }
	id=$(echo "$flow" | sed -n 's/^  "id": \([0-9]*\),*$/\1/p')
	ip netns exec callee voipgen recv --listen "$3-${3##*:}" --duration 12s --idle 2s --json > /tmp/recv.json &
	rpid=$!
	poll 10 "voipgen recv listening on $3" listening callee "${3##*:}" 1 || { kill $rpid; return 1; }
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

# scheduling: dataplane.worker_priority lowers the workers' nice value
# under the unit (LimitNICE=); real time (fifo) is refused by the unit's
# RestrictRealtime=yes, with an error that says what to allow, and runs
# with the drop-in relayd.toml(5) gives. Each worker's thread is named
# relayd-wN. The config and the unit are as they were after.
scheduling() {
	cp "$config" /run/relayd.toml.saved
	dropin=/run/systemd/system/relayd.service.d
	set_sched() {
		sed -i -e "s/^worker_scheduling = .*/worker_scheduling = \"$1\"/" -e "s/^worker_priority = .*/worker_priority = $2/" "$config"
	}
	# workers POLICY RTPRIO NICE: every relayd-wN thread runs so
	# (/proc/PID/task/TID/stat: policy 0 other, 1 fifo; fields 41, 40,
	# 19), and there is one per CPU.
	workers() {
		pid=$(systemctl show -p MainPID --value relayd)
		got=$(cat /proc/"$pid"/task/*/stat 2>/dev/null | awk '$2 ~ /^\(relayd-w[0-9]+\)$/ { print $2, $41, $40, $19 }')
		n=$(echo "$got" | grep -c .)
		[ "$n" = "$(nproc)" ] || { echo "$n worker threads, want $(nproc):" >&2; echo "$got" >&2; return 1; }
		if echo "$got" | awk -v p="$1" -v r="$2" -v n="$3" '$2 != p || $3 != r || $4 != n { bad = 1 } END { exit !bad }'; then
			echo "worker threads not at policy $1, rt priority $2, nice $3 (thread, policy, rt priority, nice):" >&2; echo "$got" >&2; return 1
		fi
	}
	set_sched other -5
	must systemctl restart relayd && must workers 0 0 -5 || return 1
	set_sched fifo 10
	c=$(cursor)
	systemctl restart relayd 2>/dev/null && { echo "worker_scheduling fifo started under RestrictRealtime=yes" >&2; return 1; }
	journal_since "$c" | grep -q 'scheduling fifo, priority 10: operation not permitted.*RestrictRealtime=no' ||
		{ echo "no error naming RestrictRealtime=no:" >&2; journal_since "$c" | grep -i error >&2; return 1; }
	mkdir -p $dropin
	printf '[Service]\nRestrictRealtime=no\nLimitRTPRIO=10\n' > $dropin/50-realtime.conf
	systemctl daemon-reload
	systemctl reset-failed relayd
	must systemctl restart relayd && must workers 1 10 0 || return 1
	rm -f $dropin/50-realtime.conf
	systemctl daemon-reload
	cp /run/relayd.toml.saved "$config"
	systemctl reset-failed relayd
	must systemctl restart relayd && must workers 0 0 0
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

# sip: the B2BUA on the caller side's relay addresses, IPv4 and IPv6,
# routes to the callee (user calleeb and callee6b to its second port, for
# the second set of calls_across); the shipped config keeps calls in
# /var/lib/relayd/state.db.
sip() {
	must grep -q '^path = "/var/lib/relayd/state.db"' "$config" || return 1
	must sed -i '/^\[sip\]/,/^\[/ s|^listen = \[\] .*|listen = ["udp:198.18.0.1:5060", "udp:[2001:2::1]:5060"]|' "$config" || return 1
	cat >> "$config" <<'EOT'
[[route]]
name = "calleeb"
match = "^calleeb$"
destinations = ["sip:198.18.2.2:5062"]
[[route]]
name = "callee6b"
match = "^callee6b$"
destinations = ["sip:[2001:2:0:2::2]:5062"]
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

# calls_across NAME SET NEXT ACTION...: calls across a restart of relayd
# that ACTION makes: two IPv4 calls and one IPv6 call with G.711 both
# ways between voipgen call in the caller namespace and voipgen answer in
# the callee's, through relayd's B2BUA and XDP, placed before and hung up
# after it. ACTION runs once every call's media is on XDP (latched and
# locked) and relayd has kept that in its state; the calls are held until
# a new relayd (another main PID) answers while the callers are still in
# them, has the three calls back, and has relayed their media for $hold
# s; then the caller hangs up (SIGUSR1: voipgen's own BYE). Every call
# must complete (BYE from the caller, 200 from the callee through the new
# relayd), no RTP packet may be lost either way, and the CDR file gets
# one complete answered line per call.
#
# The calls are set SET (a or b: callset); set NEXT (- for none), the
# next check's, is placed while SET is held after the restart, so that it
# is steady when the next check starts.
#
# The actions: `systemctl restart` (SIGTERM: relayd saves, the new one
# restores), kill -9 (systemd restarts relayd: what the state file's last
# write kept) and an upgrade (apt, postinst's restart). A rollback (apt
# --allow-downgrades to the version before) had a check of its own: with
# the same binary on both sides, it ran the upgrade's maintainer scripts
# and restart again, and cost CI a minute.
hold=5
calls_across() {
	act=$1 g=$2 next=$3
	shift 3
	eval "all=\${all_$g:-}"
	ct0=$(ms)
	[ -n "$all" ] || place $g || return 1
	steady $g || { stop_set $g; return 1; }
	figure ${act}_steady_ms $(( $(ms) - ct0 ))
	eval "all=\${all_$g:-} callers=\${callers_$g:-}"
	pid=$(systemctl show -p MainPID --value relayd)
	relayctl stats | grep -E '^relayd_(packets|xdp|userspace)[a-z_]*\{' > /tmp/stats.before
	t0=$(ms)
	"$@" || { echo "$act: the action failed" >&2; stop_set $g; return 1; }
	figure ${act}_action_ms $(( $(ms) - t0 ))
	# Back when the admin API answers again.
	# A deadline, not a wait: generous for a guest slowed by a busy host
	# (a restart has taken 40 s there).
	poll 120 "relayd back (relayctl health)" relayctl health || { stop_set $g; return 1; }
	figure ${act}_back_ms $(( $(ms) - t0 ))
	new=$(systemctl show -p MainPID --value relayd)
	[ "${new:-0}" != 0 ] && [ "$new" != "$pid" ] || { echo "$act: relayd not restarted (main pid $pid, now $new)" >&2; stop_set $g; return 1; }
	# The calls span the restart: the callers are still in them, and the
	# new relayd took all three back (it restores calls before it
	# serves) and counts their media.
	for p in $callers; do
		kill -0 $p 2>/dev/null || { echo "$act: a caller's calls ended before relayd was back" >&2; stop_set $g; return 1; }
	done
	restored $g || { echo "$act: the new relayd (pid $new) does not have the three calls" >&2; relayctl calls >&2; stop_set $g; return 1; }
	echo "$act: relayd pid $pid -> $new, the calls up"
	# Media through the new relayd for a while: its sweeps of calls and
	# flows (every 2 and 5 s) run over the restored calls. The next set
	# comes up meanwhile.
	hold_end=$(( $(ms) + hold * 1000 ))
	# Not past the hold: polling (a relayctl and a jq, about a second of
	# TCG each) while the next set latches starves relayd's workers, and
	# the packets they then send seconds late arrive among XDP's (a CI run
	# lost 380 packets that way in calls_across_upgrade).
	if [ "$next" != - ] && place $next; then
		left=$(( (hold_end - $(ms)) / 1000 ))
		[ $left -lt 1 ] || { poll $left "" calls_on_xdp $next && eval "up_$next=$(ms)"; }
	fi
	left=$(( hold_end - $(ms) ))
	figure ${act}_hold_left_ms $left
	[ $left -le 0 ] || sleep_ms $left
	ct0=$(ms)
	kill -USR1 $callers
	wait $all
	eval "all_$g="
	figure ${act}_hangup_ms $(( $(ms) - ct0 ))
	ct0=$(ms)
	# One jq over the four reports (a process costs the better part of a
	# second under TCG): for each its name, succeeded, with media both
	# ways, lost, max gap and summary; then the IPv4 calls the caller
	# ended with its own BYE, and the callers' Call-IDs.
	ok=0 reports=0 ids=
	while read -r rep got both lost gap sum; do
		case $rep in
		'') continue ;;
		byes)
			[ "$got" = 2 ] || { echo "the caller ended $got of the two IPv4 calls with its own BYE" >&2; ok=1; }
			continue ;;
		ids) ids=$got; continue ;;
		esac
		reports=$((reports + 1))
		echo "$rep: $sum"
		want=2
		case $rep in *6) want=1 ;; esac
		figure "${act}_${rep}_lost" "$lost"
		figure "${act}_${rep}_max_gap_ms" "$gap"
		[ "$got" = "$want" ] && [ "$both" = "$want" ] || { echo "$rep: $got of $want calls succeeded, $both with media both ways" >&2; ok=1; }
		[ "$lost" = 0 ] || { echo "$rep: $lost RTP packets lost across $act" >&2; ok=1; }
	done <<EOT
$(cd /tmp && jq -r -s '. as $r | (["call4", "call6", "answer4", "answer6"] | to_entries[] |
	$r[.key].summary as $s | "\(.value) \($s.succeeded) \($s.calls_with_media_both_ways) \($s.lost) \($s.max_gap_ms.max) \($s | tojson)"),
	"byes \([$r[0].calls[] | select(.bye_from == "local")] | length)",
	"ids \([$r[0].calls[], $r[1].calls[] | .call_id] | tojson)"' ${g}call4.json ${g}call6.json ${g}answer4.json ${g}answer6.json)
EOT
	figure ${act}_reports_ms $(( $(ms) - ct0 ))
	ct0=$(ms)
	[ $reports = 4 ] || { echo "$act: $reports of the four voipgen reports read" >&2; return 1; }
	[ $ok = 0 ] || loss_state "$t0" "$g"
	# One complete answered CDR for each of the three calls (by the
	# caller's Call-ID). relayd writes CDRs in batches
	# (cdr.fsync_interval): poll for them, up to 10 s, rather than read
	# once right after the calls ended.
	if ! poll 10 "" cdrs_complete "$ids"; then
		jq -c --argjson ids "$ids" 'select(.legs[0].call_id as $id | $ids | index($id))' /var/log/relayd/cdr.jsonl
		echo "$n complete answered CDRs of the three calls after $act, want 3" >&2
		ok=1
	fi
	figure ${act}_cdr_ms $(( $(ms) - ct0 ))
	return $ok
}

# loss_state T0 G: where set G's packets could have gone, for a check that
# lost some: relayd's packet counters by verdict and reason since the
# action (a punt while no worker runs is lost), the packets the voipgens
# failed to send (by errno), the end namespaces' UDP and IP drops, the
# guest's memory, the relay's neighbours (XDP punts what it cannot
# resolve), the flows, and what relayd logged at warning or worse since
# T0 (ms).
loss_state() {
	echo "-- relayd's XDP counters since the action (pinned: they span restarts), and its userspace"
	echo "   counters before the action (the old relayd's, since its start) and now (the new one's):"
	relayctl stats | grep -E '^relayd_(packets|xdp|userspace)[a-z_]*\{' > /tmp/stats.after
	[ -s /tmp/stats.before ] || echo "(relayctl stats gave nothing before the action: the figures are since boot)"
	awk 'FILENAME == ARGV[1] { before[$1] = $2; next }
		$1 ~ /^relayd_userspace|reason="userspace_/ { if ($2 != 0 || before[$1] != 0) print $1, "before", before[$1] + 0, "now", $2; next }
		{ d = $2 - before[$1]; if (d != 0) print $1, d }' /tmp/stats.before /tmp/stats.after
	echo "-- the voipgens' send errors (packets never sent: their receiver counts them lost):"
	(cd /tmp && jq -c '{send_errors: .summary.send_errors, kinds: [.calls[] | .send_error_kinds // empty]}' ${2}call4.json ${2}call6.json ${2}answer4.json ${2}answer6.json)
	echo "-- when the packets went missing (the action began at $(date -u -d @$(( $1 / 1000 )) +%T)):"
	for r in call4 call6 answer4 answer6; do
		jq -r --arg r $r '.calls[] | select(.received != null) | .received.loss_periods[] | "\($r): after \(.start) lost \(.lost), gap \(.gap_ms) ms"' /tmp/${2}$r.json
	done
	echo "-- sequence restarts (packets hundreds out of order, or a sender that restarted; lost counts from the last):"
	for r in call4 call6 answer4 answer6; do
		jq -r --arg r $r '.calls[] | select(.received != null) | "\($r) call \(.call): resyncs \(.received.resyncs), reordered \(.received.reordered), duplicates \(.received.duplicates)"' /tmp/${2}$r.json
	done
	echo "-- relayd's stops and starts since the action:"
	journalctl -u relayd --no-pager -o short-iso-precise --since=@$(( $1 / 1000 )) | grep -E 'Stopping|Stopped|Starting|Started|relayd ready|calls restored|shutting down|exited' | cut -c1-200
	echo "-- UDP and IP drops in the end namespaces (nstat, since boot):"
	for ns in caller callee; do
		echo "$ns: $(ip netns exec $ns nstat -asz 2>/dev/null | awk '$1 ~ /^(Udp6?(RcvbufErrors|SndbufErrors|InErrors|NoPorts)|Ip6?(OutNoRoutes|OutDiscards|InDiscards)|Ip6InNoRoutes)$/ && $2 != 0 { printf "%s %s ", $1, $2 }')"
	done
	echo "-- links that dropped packets (since boot):"
	for ns in "" caller callee; do
		${ns:+ip netns exec $ns} ip -j -s link show | jq -r --arg ns "${ns:-relay}" '.[] | select(.stats64.rx.dropped + .stats64.tx.dropped > 0) |
			"\($ns) \(.ifname): rx dropped \(.stats64.rx.dropped), tx dropped \(.stats64.tx.dropped)"'
	done
	echo "-- memory:"
	grep -E '^(MemTotal|MemAvailable|Committed_AS):' /proc/meminfo | tr -s ' \n' ' '; echo
	echo "-- neighbours:"
	ip neigh show; ip -6 neigh show
	echo "-- flows:"
	relayctl -json calls | jq -c '.calls[] | {to, flows: [.flows[] | {match, path, packets, dropped, lost}]}'
	echo "-- relayd's warnings since the action:"
	journalctl -u relayd --no-pager -o cat -p warning --since=@$(( $1 / 1000 )) | tail -n 40
}
# callset G: set G's callee users, the callee's SIP port, the callers' SIP
# port and first RTP ports (IPv4, IPv6; the callee's too). Two sets, so
# that one can be up while the other is hung up.
callset() {
	case $1 in
	a) user=callee user6=callee6 sipport=5060 callerport=5070 rtp=20000 rtp6=21000 ;;
	b) user=calleeb user6=callee6b sipport=5062 callerport=5074 rtp=20100 rtp6=21100 ;;
	esac
}
# place G: answer and place set G's calls (of 600 s at most: the check
# hangs them up, or a failure kills them). $all_G and $callers_G are
# their processes.
place() {
	callset $1
	ip netns exec callee voipgen answer --sip 198.18.2.2:$sipport --rtp-port $rtp --duration 600s --max-calls 2 --json > /tmp/$1answer4.json 2>/tmp/$1answer4.err &
	pa4=$!
	ip netns exec callee voipgen answer --sip "[2001:2:0:2::2]:$sipport" --rtp-port $rtp --duration 600s --max-calls 1 --json > /tmp/$1answer6.json 2>/tmp/$1answer6.err &
	pa6=$!
	eval "all_$1='$pa4 $pa6' callers_$1= up_$1= placed_$1=$(ms)"
	poll 30 "voipgen answer listening on both callee addresses (port $sipport)" listening callee $sipport 2 || { stop_set $1; return 1; }
	ip netns exec caller voipgen call --sip 198.18.0.2:$callerport --target sip:$user@198.18.0.1:5060 \
		--rtp-port $rtp --calls 2 --rate 4 --call-duration 600s --json > /tmp/$1call4.json 2>/tmp/$1call4.err &
	pc4=$!
	ip netns exec caller voipgen call --sip "[2001:2::2]:$callerport" --target "sip:$user6@[2001:2::1]:5060" \
		--rtp-port $rtp6 --calls 1 --call-duration 600s --json > /tmp/$1call6.json 2>/tmp/$1call6.err &
	pc6=$!
	eval "all_$1='$pc4 $pc6 $pa4 $pa6' callers_$1='$pc4 $pc6'"
}
# stop_set G: kill set G's processes (a check that failed).
stop_set() {
	eval "stop_pids=\${all_$1:-}"
	[ -z "$stop_pids" ] || { kill $stop_pids 2>/dev/null; wait $stop_pids; }
	eval "all_$1="
}
# steady G: set G's three calls answered with RTP both ways on XDP, then
# each flow's latch window (media.latch_window, 3 s from its first
# packet) closed and relayd recorded the locked source at its next sweep
# (every 2 s, docs/state.md): 5.5 s. Neither shows in the admin API; a
# restart before them would test calls still latching.
steady() {
	eval "up=\${up_$1:-}"
	if [ -z "$up" ]; then
		poll 60 "three answered calls of set $1 with RTP both ways on XDP" calls_on_xdp $1 || { set_state $1; return 1; }
		up=$(ms)
	fi
	left=$(( up + 5500 - $(ms) ))
	[ $left -le 0 ] || sleep_ms $left
}
# set_state G: what relayd and set G's voipgens say, for a check that
# failed.
set_state() {
	relayctl -json calls | jq -c '.calls[] | {to, answer, flows: [.flows[] | {match, path, packets}]}'
	for f in /tmp/$1call4.err /tmp/$1call6.err /tmp/$1answer4.err /tmp/$1answer6.err; do
		echo "$f:"; head -n 30 "$f"
	done
	# A voipgen that has ended wrote its report: each call's final status
	# and error say what became of it.
	eval "state_pids=\${all_$1:-}"
	for p in $state_pids; do
		kill -0 "$p" 2>/dev/null && echo "voipgen pid $p running" || echo "voipgen pid $p ended"
	done
	for r in call4 call6 answer4 answer6; do
		[ -s /tmp/$1$r.json ] || continue
		echo "$1$r.json:"
		jq -c '.calls[] | {call, call_id, status, success, error, duration_s, bye_from}' /tmp/$1$r.json
	done
	echo "-- relayd's SIP counters:"
	relayctl stats | grep -E '^relayd_sip_[a-z_]*(\{| )' | grep -v ' 0$' | head -n 40
	echo "-- relayd's log since set $1 was placed:"
	eval "placed=\${placed_$1:-0}"
	journalctl -u relayd --no-pager -o short-iso-precise --since=@$(( placed / 1000 )) | cut -c1-300 | tail -n 60
}
sleep_ms() { sleep "$(( $1 / 1000 )).$(printf %03d $(( $1 % 1000 )))"; }
# cdrs_complete IDS: the CDR file has a complete answered line for each
# of the three Call-IDs in IDS (a JSON array); $n says how many it has.
cdrs_complete() {
	n=$(jq -s --argjson ids "$1" '[.[] | select(.legs[0].call_id as $id | $ids | index($id)) |
		select(.disposition == "answered" and .answer != null and .end != null and (.legs | length) == 2 and (.legs[1].call_id | length) > 0)] | length' /var/log/relayd/cdr.jsonl)
	[ "$n" = 3 ]
}

# poll SECONDS WHAT CMD...: run CMD every 0.1 s until it succeeds, for
# at most SECONDS (a deadline, not a count: a relayctl and a jq take the
# better part of a second under TCG); then say that WHAT did not happen
# (nothing when WHAT is empty).
poll() {
	poll_s=$1 poll_what=$2
	poll_end=$(( $(ms) + poll_s * 1000 ))
	shift 2
	until "$@" >/dev/null 2>&1; do
		if [ "$(ms)" -ge $poll_end ]; then
			[ -z "$poll_what" ] || echo "no $poll_what within $poll_s s" >&2
			return 1
		fi
		sleep 0.1
	done
}
# listening NS PORT N: N UDP sockets bound to PORT in namespace NS.
listening() { [ "$(ip netns exec "$1" ss -Hlun "sport = :$2" | wc -l)" -ge "$3" ]; }
# setcalls G: jq's selection of set G's calls among relayd's (by the
# callee user in their To).
setcalls() {
	case $1 in
	a) echo '.calls[] | select(.to | test("^sip:callee6?@"))' ;;
	b) echo '.calls[] | select(.to | test("^sip:callee6?b@"))' ;;
	esac
}
# calls_on_xdp G: relayd has set G's three calls answered, every flow on
# XDP, and the RTP flows (even ports; voipgen sends no RTCP) of both
# directions counted packets.
calls_on_xdp() {
	relayctl -json calls | jq -e "[$(setcalls $1)"' | select(.answer != null and all(.flows[]; .path == "xdp") and
		([.flows[] | select((.match | split(":") | last | tonumber) % 2 == 0) | .packets > 0] | length == 2 and all))] |
		length == 3' >/dev/null
}
# call_answered: relayd has one call, answered.
call_answered() { relayctl -json calls | jq -e '[.calls[] | select(.answer != null)] | length == 1' >/dev/null; }
# restored G: relayd has set G's three calls, answered, with both legs and
# every flow on XDP.
restored() {
	relayctl -json calls | jq -e "[$(setcalls $1)"' | select(.answer != null and (.legs[1].call_id | length) > 0 and
		(.flows | length) > 0 and all(.flows[]; .path == "xdp"))] | length == 3' >/dev/null
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
	poll 30 "voipgen answer listening on 198.18.2.2:5060" listening callee 5060 1 || { kill $a; return 1; }
	ip netns exec caller voipgen call --sip 198.18.0.2:5070 --target sip:callee@198.18.0.1:5060 \
		--calls 1 --call-duration 40s --json > /tmp/dcall.json 2>/tmp/dcall.err &
	c=$!
	poll 30 "the call answered" call_answered || { kill $c $a; return 1; }
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
check scheduling scheduling
check bpffs bpffs
check watchdog watchdog
check sip sip
check calls_across_restart calls_across restart a b restart_relayd
check calls_across_kill9 calls_across kill9 b a kill9
check calls_across_upgrade calls_across upgrade a - next_version
check journal_err journal_err
check drain drain
journalctl -u relayd --no-pager -o cat > "$share/relayd.journal"
check remove remove
check purge purge

echo $failed > "$share/status"
