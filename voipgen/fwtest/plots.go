package fwtest

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	_ "gonum.org/v1/plot/vg/vgimg" // PNG canvases
	_ "gonum.org/v1/plot/vg/vgsvg" // SVG canvases
)

// Figure sizes: the house look of voipgen's plots.
const (
	plotW = 20 * vg.Centimeter
	plotH = 12 * vg.Centimeter
)

// plots draws every figure the report has data for into dir and returns
// the files written.
func (r *Report) plots(dir string) ([]string, error) {
	var files []string
	for i, s := range r.Summaries() {
		row := r.worstRep(s.Case)
		if row == nil || row.Analysis == nil || len(row.Analysis.Timeline.All) == 0 {
			continue
		}
		top, bottom := timelinePlots(row)
		name := fmt.Sprintf("timeline-%d-%s", i+1, slug(s.Case.String()))
		fs, err := save(dir, name, plotW, 2*plotH, [][]*plot.Plot{{top}, {bottom}})
		files = append(files, fs...)
		if err != nil {
			return files, err
		}
	}
	if p := r.glitchCDF(); p != nil {
		fs, err := save(dir, "glitch-cdf", plotW, plotH, [][]*plot.Plot{{p}})
		files = append(files, fs...)
		if err != nil {
			return files, err
		}
	}
	if p, err := r.stepsPlot(); err != nil {
		return files, err
	} else if p != nil {
		fs, err := save(dir, "throughput-steps", plotW, plotH, [][]*plot.Plot{{p}})
		files = append(files, fs...)
		if err != nil {
			return files, err
		}
	}
	return files, nil
}

// worstRep is the repetition of a case with the most streams that never
// recovered, then the longest glitch.
func (r *Report) worstRep(c FailoverCase) *FailoverRow {
	var worst *FailoverRow
	for i := range r.Failovers {
		f := &r.Failovers[i]
		if f.Case != c || f.Analysis == nil {
			continue
		}
		if worst == nil || f.NeverRecovered > worst.NeverRecovered ||
			(f.NeverRecovered == worst.NeverRecovered && nanLess(worst.GlitchMax, f.GlitchMax)) {
			worst = f
		}
	}
	return worst
}

// nanLess is a < b with NaN below everything.
func nanLess(a, b Ms) bool {
	if math.IsNaN(float64(a)) {
		return !math.IsNaN(float64(b))
	}
	return a < b
}

// timelinePlots are the packets received per ms around the failure: of
// all streams (top) and of the worst stream (bottom), against ms since the
// failure.
func timelinePlots(row *FailoverRow) (*plot.Plot, *plot.Plot) {
	f := row.Analysis
	tl := f.Timeline
	line := func(counts []int) plotter.XYs {
		xy := make(plotter.XYs, len(counts))
		for i, n := range counts {
			xy[i] = plotter.XY{X: float64(tl.Start+int64(i)*tl.BucketNs-f.FailAt) / 1e6, Y: float64(n)}
		}
		return xy
	}
	mk := func(title string, counts []int, c color.Color) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "ms since the failure"
		p.Y.Label.Text = "packets received per ms"
		p.Y.Min = 0
		p.Add(plotter.NewGrid())
		if l, err := plotter.NewLine(line(counts)); err == nil {
			l.StepStyle = plotter.PostStep
			l.Color = c
			p.Add(l)
		}
		// The failure instant.
		if v, err := plotter.NewLine(plotter.XYs{{X: 0, Y: 0}, {X: 0, Y: float64(max(1, slices.Max(append([]int{0}, counts...))))}}); err == nil {
			v.Color = color.RGBA{R: 200, A: 255}
			v.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			p.Add(v)
			p.Legend.Add("failure", v)
		}
		p.Legend.Top = true
		return p
	}
	top := mk(fmt.Sprintf("%s\nrep %d: all %d streams (outage %s, resolution %s)", row.Case, row.Rep, len(f.Streams), f.OutageMs, f.ResolutionMs),
		tl.All, plotutil.Color(0))
	worstTitle := "no stream to show"
	for _, s := range f.Streams {
		if s.ID == tl.WorstID {
			worstTitle = fmt.Sprintf("worst stream %s: glitch %s, %d missing by sequence", s.Name, s.GlitchMs, s.MissingSeq)
			break
		}
	}
	bottom := mk(worstTitle, tl.Worst, plotutil.Color(1))
	return top, bottom
}

// glitchCDF is the distribution of the per-stream glitch of each case over
// all its repetitions, or nil with no glitch to draw.
func (r *Report) glitchCDF() *plot.Plot {
	p := plot.New()
	p.Title.Text = "Per-stream glitch (streams that recovered, all repetitions)"
	p.X.Label.Text = "glitch, ms of media missing"
	p.Y.Label.Text = "fraction of streams"
	p.Y.Min, p.Y.Max = 0, 1
	p.Add(plotter.NewGrid())
	n := 0
	for i, s := range r.Summaries() {
		var g []float64
		for _, f := range r.Failovers {
			if f.Case != s.Case || f.Analysis == nil {
				continue
			}
			for _, st := range f.Analysis.Streams {
				if st.Status == Recovered {
					g = append(g, float64(st.GlitchMs))
				}
			}
		}
		if len(g) == 0 {
			continue
		}
		slices.Sort(g)
		xy := make(plotter.XYs, len(g))
		for j, v := range g {
			xy[j] = plotter.XY{X: v, Y: float64(j+1) / float64(len(g))}
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			continue
		}
		l.StepStyle = plotter.PostStep
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i)
		p.Add(l)
		label := s.Case.String()
		if s.NeverRecovered > 0 {
			label += fmt.Sprintf(" (%d never recovered)", s.NeverRecovered)
		}
		p.Legend.Add(label, l)
		n++
	}
	if n == 0 {
		return nil
	}
	p.Legend.Top = false
	p.Legend.Left = false
	return p
}

// stepsPlot is the loss of every step of every search against its offered
// rate, sender-limited steps apart; nil with no search.
func (r *Report) stepsPlot() (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = "Throughput search steps (highest loss over each step's trials)"
	p.X.Label.Text = "offered rate, pps"
	p.Y.Label.Text = "loss %"
	p.Y.Min = 0
	p.X.Tick.Marker = wholeTicks{}
	p.Add(plotter.NewGrid())
	n := 0
	for i, t := range r.Throughput {
		var judged, limited plotter.XYs
		for _, s := range t.Search.Steps {
			pt := plotter.XY{X: float64(s.PPS), Y: 100 * s.MaxLoss}
			if s.Outcome == SenderLimited {
				limited = append(limited, pt)
			} else {
				judged = append(judged, pt)
			}
		}
		for _, set := range []struct {
			xy    plotter.XYs
			label string
			shape draw.GlyphDrawer
		}{
			{judged, t.Case, draw.CircleGlyph{}},
			{limited, t.Case + " (sender-limited)", draw.CrossGlyph{}},
		} {
			if len(set.xy) == 0 {
				continue
			}
			sc, err := plotter.NewScatter(set.xy)
			if err != nil {
				return nil, fmt.Errorf("plot steps: %w", err)
			}
			sc.GlyphStyle.Color = plotutil.Color(i)
			sc.GlyphStyle.Shape = set.shape
			sc.GlyphStyle.Radius = vg.Points(3)
			p.Add(sc)
			p.Legend.Add(set.label, sc)
			n++
		}
	}
	if n == 0 {
		return nil, nil
	}
	p.Legend.Top, p.Legend.Left = true, true
	return p, nil
}

// save draws the plots, in rows of columns, into name.png and name.svg in
// dir.
func save(dir, name string, w, h vg.Length, plots [][]*plot.Plot) ([]string, error) {
	var files []string
	for _, ext := range []string{"png", "svg"} {
		c, err := draw.NewFormattedCanvas(w, h, ext)
		if err != nil {
			return files, fmt.Errorf("plot %s: %w", name, err)
		}
		canvases := plot.Align(plots, draw.Tiles{Rows: len(plots), Cols: len(plots[0]), PadY: vg.Centimeter}, draw.New(c))
		for i, row := range plots {
			for j, p := range row {
				p.Draw(canvases[i][j])
			}
		}
		path := filepath.Join(dir, name+"."+ext)
		f, err := os.Create(path)
		if err != nil {
			return files, fmt.Errorf("plot %s: %w", name, err)
		}
		_, err = c.WriteTo(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, fmt.Errorf("plot %s: %w", path, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// wholeTicks are the default ticks labelled without decimals.
type wholeTicks struct{}

// Ticks implements plot.Ticker.
func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = fmt.Sprintf("%.0f", ticks[i].Value)
		}
	}
	return ticks
}
