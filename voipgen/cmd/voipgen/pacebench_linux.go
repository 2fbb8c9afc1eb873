package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"text/tabwriter"

	"github.com/relayd/relayd/voipgen/bench"
)

// runPacebench is voipgen pacebench.
func runPacebench(ctx context.Context, args []string, out io.Writer) error {
	cfg, err := bench.ParsePace(args, out)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("pacebench needs root (network namespaces)")
	}
	if _, err := exec.LookPath("sipp"); err != nil {
		return errors.New("pacebench needs sipp (apt-get install sip-tester)")
	}
	rows, err := bench.Pace(ctx, cfg, os.Stderr)
	if err != nil {
		return err
	}
	if cfg.JSON {
		return json.NewEncoder(out).Encode(rows)
	}
	tw := tabwriter.NewWriter(out, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SENDER\tCALLS\tSTREAMS\tPACKETS\tLOST\tMAX_GAP_P50_MS\tMAX_GAP_P99_MS\tMAX_GAP_MAX_MS\tJITTER_P50_MS\tJITTER_MAX_MS\tSENDER_LATE_P99_MS\t")
	for _, r := range rows {
		late := "-"
		if r.Sender == "voipgen" {
			late = fmt.Sprintf("%.1f", r.LateP99us/1e3)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.3f\t%.3f\t%s\t\n", r.Sender, r.Calls, r.Streams, r.Packets, r.Lost,
			r.MaxGapMs.P50, r.MaxGapMs.P99, r.MaxGapMs.Max, r.JitterMs.P50, r.JitterMs.Max, late)
	}
	tw.Flush()
	for _, r := range rows {
		if r.Note != "" {
			fmt.Fprintf(out, "%s %d: %s\n", r.Sender, r.Calls, r.Note)
		}
	}
	return nil
}
