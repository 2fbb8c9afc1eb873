package fastpath

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"golang.org/x/sys/unix"
)

// needs are the kernel features the XDP program uses, each with the name an
// operator can look up.
var needs = []struct {
	what  string
	probe func() error
}{
	{"XDP programs", func() error { return features.HaveProgramType(ebpf.XDP) }},
	{"hash maps", func() error { return features.HaveMapType(ebpf.Hash) }},
	{"per-CPU array maps", func() error { return features.HaveMapType(ebpf.PerCPUArray) }},
	{"device maps (XDP redirect)", func() error { return features.HaveMapType(ebpf.DevMap) }},
	{"the bpf_fib_lookup helper in XDP", func() error { return features.HaveProgramHelper(ebpf.XDP, asm.FnFibLookup) }},
	{"the bpf_redirect_map helper in XDP", func() error { return features.HaveProgramHelper(ebpf.XDP, asm.FnRedirectMap) }},
	{"bpf_spin_lock in XDP", func() error { return features.HaveProgramHelper(ebpf.XDP, asm.FnSpinLock) }},
}

// explainLoad turns a refused load into an error that names the kernel,
// what it lacks of what the program needs, and the verifier's reason with
// its full log.
func explainLoad(err error) error {
	release := "unknown"
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		release = unix.ByteSliceToString(u.Release[:])
	}
	var missing []string
	for _, n := range needs {
		if perr := n.probe(); perr != nil {
			missing = append(missing, n.what)
		}
	}
	lacks := ""
	if len(missing) > 0 {
		lacks = "; the kernel lacks " + strings.Join(missing, ", ")
	}
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		return fmt.Errorf("kernel %s refused the XDP program%s: the verifier says: %v\nverifier log:\n%+v", release, lacks, ve, ve)
	}
	return fmt.Errorf("kernel %s refused the XDP program%s: %w", release, lacks, err)
}
