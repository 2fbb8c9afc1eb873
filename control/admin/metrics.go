package admin

import (
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/dataplane"
)

var (
	packetsDesc = prometheus.NewDesc("relayd_packets_total",
		"Packets seen by the data planes, by verdict and reason.", []string{"verdict", "reason"}, nil)
	bytesDesc = prometheus.NewDesc("relayd_bytes_total",
		"Bytes (IP layer) seen by the data planes, by verdict and reason.", []string{"verdict", "reason"}, nil)
	flowsDesc = prometheus.NewDesc("relayd_flows",
		"Flows installed, by data path.", []string{"path"}, nil)
	attachedDesc = prometheus.NewDesc("relayd_xdp_attached",
		"1 for each interface the XDP program is attached to, with its mode.", []string{"interface", "mode"}, nil)
)

// collector reads the data planes at scrape time.
type collector struct {
	mgr       *control.Manager
	observers []dataplane.Observer
	log       *zap.Logger
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- packetsDesc
	ch <- bytesDesc
	ch <- flowsDesc
	ch <- attachedDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for path, n := range c.mgr.Counts() {
		ch <- prometheus.MustNewConstMetric(flowsDesc, prometheus.GaugeValue, float64(n), string(path))
	}
	// Several observers may report the same verdict and reason: sum them,
	// since a metric may appear only once per label set.
	type key struct{ verdict, reason string }
	packets := make(map[key]uint64)
	bytes := make(map[key]uint64)
	var order []key
	attached := make(map[[2]string]bool)
	for _, o := range c.observers {
		counters, err := o.Counters()
		if err != nil {
			ch <- prometheus.NewInvalidMetric(packetsDesc, err)
			continue
		}
		for _, ct := range counters {
			k := key{ct.Verdict, ct.Reason}
			if _, ok := packets[k]; !ok {
				order = append(order, k)
			}
			packets[k] += ct.Packets
			bytes[k] += ct.Bytes
		}
		for _, i := range o.Interfaces() {
			attached[[2]string{i.Name, i.Mode}] = true
		}
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(packets[k]), k.verdict, k.reason)
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(bytes[k]), k.verdict, k.reason)
	}
	for k := range attached {
		ch <- prometheus.MustNewConstMetric(attachedDesc, prometheus.GaugeValue, 1, k[0], k[1])
	}
}
