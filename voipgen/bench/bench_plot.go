package bench

import (
	"fmt"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// benchPlots draws the sweep: CPU % (tasks) against concurrent calls per
// relay, the picture of the TransNexus Asterisk graphs, and CPU ns per
// relayed packet per relay; each as PNG and SVG in dir. It returns the
// files written.
func benchPlots(rep *Report, dir string) ([]string, error) {
	var relays []string
	for _, r := range rep.Rows {
		if !slices.Contains(relays, r.Relay) {
			relays = append(relays, r.Relay)
		}
	}
	type fig struct {
		name, title, y string
		value          func(benchRow) float64
	}
	var files []string
	for _, f := range []fig{
		{"cpu", "Relay CPU vs concurrent calls (G.711 20 ms; transcode: G.711 <-> G.729; schedstat minus direct baseline)", "CPU % of the machine",
			func(r benchRow) float64 { return r.TaskCPUPct }},
		{"nsperpkt", "Relay CPU per relayed packet (schedstat minus direct baseline)", "ns per packet",
			func(r benchRow) float64 { return r.TaskNsPerPkt }},
	} {
		p := plot.New()
		p.Title.Text = f.title
		p.X.Label.Text = "concurrent calls"
		p.Y.Label.Text = f.y
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		var lines []any
		var ticks []plot.Tick
		maxY := 0.0
		for _, relay := range relays {
			var xy plotter.XYs
			for _, r := range rep.Rows {
				if r.Relay == relay && r.Comparable && r.lossless() {
					xy = append(xy, plotter.XY{X: float64(r.Calls), Y: f.value(r)})
					maxY = max(maxY, f.value(r))
					if !slices.ContainsFunc(ticks, func(t plot.Tick) bool { return t.Value == float64(r.Calls) }) {
						ticks = append(ticks, plot.Tick{Value: float64(r.Calls), Label: fmt.Sprint(r.Calls)})
					}
				}
			}
			if len(xy) > 0 {
				lines = append(lines, relay, xy)
			}
		}
		// The transcode line's floor: bcg729 alone at the transcode
		// steps' call counts (the same run's in-process timing).
		if f.name == "cpu" && rep.Transcode != nil && rep.Transcode.Bcg729.NsPerCallSecond > 0 {
			cpus, _ := rep.Config["cpus"].(int)
			var xy plotter.XYs
			for _, r := range rep.Rows {
				if r.Relay == transcodeRelayd && r.Comparable && r.lossless() && cpus > 0 {
					y := 100 * float64(r.Calls) * rep.Transcode.Bcg729.NsPerCallSecond / 1e9 / float64(cpus)
					xy = append(xy, plotter.XY{X: float64(r.Calls), Y: y})
				}
			}
			if len(xy) > 0 {
				lines = append(lines, "bcg729 alone (in-process)", xy)
			}
		}
		if len(lines) > 0 {
			if err := plotutil.AddLinePoints(p, lines...); err != nil {
				return files, fmt.Errorf("plot %s: %w", f.name, err)
			}
		}
		// Room above the lines for the legend.
		if maxY > 0 {
			p.Y.Max = maxY * 1.4
		}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Legend.Top, p.Legend.Left = true, true
		for _, ext := range []string{"png", "svg"} {
			path := filepath.Join(dir, f.name+"."+ext)
			if err := p.Save(20*vg.Centimeter, 12*vg.Centimeter, path); err != nil {
				return files, fmt.Errorf("plot %s: %w", path, err)
			}
			files = append(files, path)
		}
	}
	return files, nil
}
