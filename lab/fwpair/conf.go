package fwpair

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"
)

// syncPort is conntrackd's UDP port on the sync link.
const syncPort = 3780

// Priorities: fw1 is the preferred master; lowering by lowerWeight puts it
// below fw2.
var priority = [2]int{150, 100}

const lowerWeight = 100

// Virtual router ids of the two instances.
const (
	lanVRID = 10
	wanVRID = 20
)

// fwFiles are the paths of one firewall's files in the pair's directory.
type fwFiles struct {
	dir                                       string
	keepalivedConf, track, notify, notifyLog  string
	pid, vrrpPid, checkersPid                 string
	conntrackdConf, ctlSocket, lock, ctLogDir string
	nftRules                                  string
}

func newFWFiles(dir string, fw int) fwFiles {
	d := filepath.Join(dir, fmt.Sprintf("fw%d", fw+1))
	return fwFiles{
		dir:            d,
		keepalivedConf: filepath.Join(d, "keepalived.conf"),
		track:          filepath.Join(d, "track"),
		notify:         filepath.Join(d, "notify.sh"),
		notifyLog:      filepath.Join(d, "notify.log"),
		pid:            filepath.Join(d, "keepalived.pid"),
		vrrpPid:        filepath.Join(d, "vrrp.pid"),
		checkersPid:    filepath.Join(d, "checkers.pid"),
		conntrackdConf: filepath.Join(d, "conntrackd.conf"),
		ctlSocket:      filepath.Join(d, "conntrackd.ctl"),
		lock:           filepath.Join(d, "conntrackd.lock"),
		ctLogDir:       d,
		nftRules:       filepath.Join(d, "rules.nft"),
	}
}

// advertString formats d for keepalived's advert_int.
func advertString(d time.Duration) string {
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", d.Seconds()), "0"), ".")
}

// keepalivedConf is the configuration of fw's keepalived.
func keepalivedConf(cfg *Config, f fwFiles, fw int) string {
	var b strings.Builder
	fmt.Fprintf(&b, `# written by lab/fwpair
global_defs {
	router_id fw%d
	script_user root
	enable_script_security
}
track_file lower {
	file %s
	weight -%d
}
vrrp_sync_group PAIR {
	group {
		LAN
		WAN
	}
	notify %s
	sync_group_tracking_weight
}
`, fw+1, f.track, lowerWeight, f.notify)
	for _, in := range []struct {
		name, ifname string
		vrid         int
		vip          string
	}{
		{"LAN", LANIfName, lanVRID, lanVIP.String()},
		{"WAN", WANIfName, wanVRID, wanVIP.String()},
	} {
		fmt.Fprintf(&b, `vrrp_instance %s {
	state BACKUP
	interface %s
	virtual_router_id %d
	version %d
	priority %d
	advert_int %s
	virtual_ipaddress {
		%s/%d dev %s
	}
	track_file {
		lower
	}
}
`, in.name, in.ifname, in.vrid, cfg.VRRPVersion, priority[fw], advertString(cfg.Advert), in.vip, subnetBits, in.ifname)
	}
	return b.String()
}

// notifyScript is keepalived's notify script for the sync group: it is
// called with GROUP, the group's name, the new state and the priority. It
// logs each step to the notify log with a nanosecond timestamp.
func notifyScript(cfg *Config, f fwFiles) string {
	var b strings.Builder
	fmt.Fprintf(&b, `#!/bin/sh
# written by lab/fwpair: keepalived's notify script for the sync group
log=%s
step() { echo "$(date +%%s%%N) $*" >> "$log"; }
step "$3 begin"
`, f.notifyLog)
	if cfg.Conntrackd {
		fmt.Fprintf(&b, `conf=%s
case "$3" in
MASTER)
	for opt in -c -f -R -B; do
		conntrackd -C "$conf" $opt
		step "MASTER conntrackd $opt rc=$?"
	done
	;;
BACKUP)
	conntrackd -C "$conf" -n
	step "BACKUP conntrackd -n rc=$?"
	;;
esac
`, f.conntrackdConf)
	}
	b.WriteString("step \"$3 done\"\n")
	return b.String()
}

// conntrackdConf is the configuration of fw's conntrackd: FTFW over the
// sync link, UDP, TCP and ICMP replicated, the firewall's own addresses
// ignored.
func conntrackdConf(f fwFiles, fw int) string {
	var ignore strings.Builder
	for _, a := range []string{"127.0.0.1", lanVIP.String(), wanVIP.String(), lanFW[fw].String(), wanFW[fw].String(), syncAddr[fw].String()} {
		fmt.Fprintf(&ignore, "\t\t\tIPv4_address %s\n", a)
	}
	return fmt.Sprintf(`# written by lab/fwpair
Sync {
	Mode FTFW {
	}
	UDP {
		IPv4_address %s
		IPv4_Destination_Address %s
		Port %d
		Interface %s
		SndSocketBuffer 1249280
		RcvSocketBuffer 1249280
		Checksum on
	}
}
General {
	Systemd off
	HashSize 8192
	HashLimit 65536
	LogFile off
	Syslog off
	LockFile %s
	UNIX {
		Path %s
	}
	NetlinkBufferSize 2097152
	NetlinkBufferSizeMaxGrowth 8388608
	Filter From Userspace {
		Protocol Accept {
			TCP
			UDP
			ICMP
		}
		Address Ignore {
%s		}
	}
}
`, syncAddr[fw], syncAddr[1-fw], syncPort, SyncIfName, f.lock, f.ctlSocket, ignore.String())
}

// nftRules is the firewall's ruleset.
func nftRules(cfg *Config) string {
	input := fmt.Sprintf(`	chain input {
		type filter hook input priority filter; policy drop;
		iif "lo" accept
		ct state established,related accept
		ip protocol 112 accept
		iifname "%s" accept
		icmp type echo-request accept
	}
`, SyncIfName)
	if cfg.Stateless {
		return fmt.Sprintf(`table inet fwpair {
	chain prerouting {
		type filter hook prerouting priority raw; policy accept;
		iifname { "%[1]s", "%[2]s" } meta l4proto udp notrack
	}
%[3]s	chain forward {
		type filter hook forward priority filter; policy drop;
		meta l4proto udp accept
		ct state established,related accept
		iifname "%[1]s" ct state new accept
	}
}
`, LANIfName, WANIfName, input)
	}
	return fmt.Sprintf(`table inet fwpair {
%s	chain forward {
		type filter hook forward priority filter; policy drop;
		ct state established,related accept
		iifname "%s" oifname "%s" ct state new accept
	}
}
`, input, LANIfName, WANIfName)
}
