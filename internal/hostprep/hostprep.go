// Package hostprep prepares the host for relayd before the daemon starts,
// with privileges the daemon itself does not keep: `relayd -prepare`, run
// by the unit's ExecStartPre=+, calls Prepare.
//
// For the configured interfaces only, Prepare
//   - turns IPv4 and IPv6 forwarding on per interface (bpf_fib_lookup in the
//     XDP program refuses to route otherwise), never the global switch;
//   - installs a forward-drop rule in an nftables table of relayd's own
//     (table inet relayd): traffic arriving on those interfaces that the
//     kernel would forward is dropped, so the appliance does not route
//     transit traffic. Media relayed by XDP never reaches that hook, and
//     packets for the relay's own addresses take the input hook;
//   - mounts a bpf filesystem on /sys/fs/bpf when the pin path is below it
//     and nothing is mounted there, in the host's mount namespace, so pinned
//     state outlives the service, and creates the pin directory, which the
//     unit makes writable (ReadWritePaths= needs it to exist).
//
// Running it again is harmless: the table is replaced atomically.
package hostprep

import (
	"fmt"
	"strings"
)

// Config says what to prepare. The zero value prepares nothing but removes
// relayd's nftables table.
type Config struct {
	// Interfaces are the XDP interfaces (dataplane.interfaces).
	Interfaces []string
	// PinPath is the bpffs directory (dataplane.pin_path); empty skips the
	// bpffs step.
	PinPath string
	// Nft is the nft binary; default "nft" from $PATH.
	Nft string

	procSys string // test knob: /proc/sys
}

// Table is the nftables table Prepare owns (family inet).
const Table = "relayd"

// Ruleset returns the nft script Prepare loads: it creates or replaces
// table inet relayd in one transaction. With no interfaces it only deletes
// the table.
func Ruleset(interfaces []string) string {
	var b strings.Builder
	// "table" adds the table when missing, so the delete never fails; both
	// and the new table are one atomic transaction.
	fmt.Fprintf(&b, "table inet %s\ndelete table inet %s\n", Table, Table)
	if len(interfaces) == 0 {
		return b.String()
	}
	quoted := make([]string, len(interfaces))
	for i, n := range interfaces {
		quoted[i] = fmt.Sprintf("%q", n)
	}
	fmt.Fprintf(&b, `table inet %s {
	comment "relayd: no transit routing between its interfaces (relayd -prepare)"
	chain forward {
		type filter hook forward priority filter; policy accept;
		iifname { %s } counter drop comment "forwarding is on for XDP's fib lookups only"
	}
}
`, Table, strings.Join(quoted, ", "))
	return b.String()
}
