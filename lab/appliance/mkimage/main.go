// Command mkimage prepares, ahead of `make test`, what the VM tests
// otherwise download and build on their first run: the appliance test's
// guest tree for the .debs in -debs (lab/appliance, cached under
// RELAYD_VM_CACHE or /var/cache/relayd-vm) and Debian's kernel for lab/vm.
// CI runs it in the background while it lints, so the tests find both in
// the cache; the tests build whatever is still missing themselves.
//
//	go run ./lab/appliance/mkimage -debs dist    # from the repository's top, as root
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/relayd/relayd/lab/appliance"
	"github.com/relayd/relayd/lab/vm"
)

func main() {
	debs := flag.String("debs", "dist", "directory with the relayd and relayd-tools .debs the appliance test boots")
	scripts := flag.String("scripts", "lab/appliance/testdata", "the appliance test's testdata directory (mkimage.sh)")
	timeout := flag.Duration("timeout", 15*time.Minute, "give up after this long")
	flag.Parse()
	if err := run(*debs, *scripts, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(debs, scripts string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	k, err := vm.DebianKernel(ctx, vm.DefaultCache)
	if err != nil {
		return fmt.Errorf("lab/vm kernel: %w", err)
	}
	log.Printf("lab/vm kernel %s in %s (%.0fs)", k.Release, k.Modules, time.Since(start).Seconds())
	deps, err := appliance.DebsDepends(debs)
	if err != nil {
		return err
	}
	start = time.Now()
	img, built, err := appliance.EnsureImage(ctx, scripts, deps, log.Printf)
	if err != nil {
		return err
	}
	if built {
		log.Printf("appliance image %s built in %.0fs", img.Root, time.Since(start).Seconds())
	} else {
		log.Printf("appliance image %s was cached", img.Root)
	}
	return nil
}
