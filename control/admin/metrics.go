package admin

import (
	"cmp"
	"runtime"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/control"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/cdr"
	"github.com/relayd/relayd/dataplane"
)

var (
	packetsDesc = prometheus.NewDesc("relayd_packets_total",
		"Packets seen by the data planes, by verdict and reason.", []string{"verdict", "reason"}, nil)
	bytesDesc = prometheus.NewDesc("relayd_bytes_total",
		"Bytes (IP layer) seen by the data planes, by verdict and reason.", []string{"verdict", "reason"}, nil)
	flowsDesc = prometheus.NewDesc("relayd_flows",
		"Flows installed (static and call flows), by data path.", []string{"path"}, nil)
	attachedDesc = prometheus.NewDesc("relayd_xdp_attached",
		"1 for each interface the XDP program is attached to, with its mode; 0 for one deleted while relayd runs, until it comes back.", []string{"interface", "mode"}, nil)
	redirectErrorsDesc = prometheus.NewDesc("relayd_xdp_redirect_errors_total",
		"Frames XDP redirected toward a device that the kernel refused to send (and dropped), by egress device.", []string{"device"}, nil)
	fallbackDesc = prometheus.NewDesc("relayd_xdp_egress_fallback",
		"1 while the flows toward a device are relayed in userspace because it refuses redirected frames, by egress device.", []string{"device"}, nil)
	portsDesc = prometheus.NewDesc("relayd_media_ports",
		"Relay media ports (RTP and RTCP) of each media interface's port range, by state.", []string{"interface", "state"}, nil)
	slotsUsedDesc = prometheus.NewDesc("relayd_flow_slots_used",
		"Entries used in a data plane's flow table (the userspace one also holds the shadows of XDP flows).", []string{"path"}, nil)
	portTableDesc = prometheus.NewDesc("relayd_xdp_port_table_flows",
		"XDP flows the program finds by their relay port in one array read (one flow per port with flows, the last installed there); the other XDP flows (the other flows of a port two relay addresses use at once, or every flow on a machine other than x86) take the flow map's slower hash lookup.", nil, nil)
	slotsMaxDesc = prometheus.NewDesc("relayd_flow_slots_max",
		"Size of a data plane's flow table (dataplane.max_flows).", []string{"path"}, nil)
	workerDelayDesc = prometheus.NewDesc("relayd_userspace_delay_seconds",
		"Time packets waited in a userspace worker's receive queue, from the kernel's receive timestamp to the worker's read (what dataplane.coalesce adds shows here).", nil, nil)
	workerWakeupsDesc = prometheus.NewDesc("relayd_userspace_wakeups_total",
		"Times the userspace workers woke: kind socket (a packet ended a wait), nap (a coalescing nap ended), signal (the Go runtime's preemption ended a wait of a busy worker).", []string{"kind"}, nil)
	workerBatchesDesc = prometheus.NewDesc("relayd_userspace_batches_total",
		"Reads (recvmmsg) of the userspace workers that returned packets.", nil, nil)
	workerAFXDPDesc = prometheus.NewDesc("relayd_userspace_afxdp_packets_total",
		"Packets the userspace workers read from their AF_XDP sockets (dataplane.userspace_io afxdp).", nil, nil)
	workerAFXDPDropDesc = prometheus.NewDesc("relayd_userspace_afxdp_dropped_total",
		"Packets the kernel dropped on their way into the userspace workers' AF_XDP sockets: reason no_frame (the fill ring was empty: the traffic outran the frames kept there, or the packet was longer than a frame), rx_ring_full (a worker's receive ring was full: the worker fell behind).", []string{"reason"}, nil)
	workerAFXDPFillDesc = prometheus.NewDesc("relayd_userspace_afxdp_fill_frames",
		"UMEM frames the AF_XDP fill rings are kept at, all queues: 20 ms of each queue's traffic, at least 512, more after a ring ran dry.", nil, nil)
	workerFlowsDesc = prometheus.NewDesc("relayd_userspace_worker_flows",
		"Flows each userspace worker carries (the shadows of XDP flows included): dataplane.pack_flows packs them onto the first workers.", []string{"worker"}, nil)
	workerLockWaitsDesc = prometheus.NewDesc("relayd_userspace_lock_waits_total",
		"Latching flows whose lock waited over 20 ms for their userspace worker to drain its receive queue: a worker reports a lock only then, since XDP taking a flow back earlier would have its next packets overtake those still queued.", nil, nil)
	cdrWrittenDesc     = prometheus.NewDesc("relayd_cdr_written_total", "CDRs written to the CDR file.", nil, nil)
	cdrWriteErrorsDesc = prometheus.NewDesc("relayd_cdr_write_errors_total", "CDRs that could not be written to the file.", nil, nil)
	cdrPostedDesc      = prometheus.NewDesc("relayd_cdr_posted_total", "CDRs the collector (cdr.post_url) accepted.", nil, nil)
	cdrPostErrorsDesc  = prometheus.NewDesc("relayd_cdr_post_errors_total", "Failed POSTs to the collector (each retry counts).", nil, nil)
	cdrDroppedDesc     = prometheus.NewDesc("relayd_cdr_dropped_total", "CDRs not posted because the queue was full.", nil, nil)
)

// buildInfo is relayd_build_info{version, goversion} 1.
func buildInfo(version string) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "relayd_build_info",
		Help:        "relayd's version (git describe) and Go version; always 1.",
		ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()},
	}, func() float64 { return 1 })
}

// capacity is implemented by data planes with a bounded flow table.
type capacity interface {
	Path() dataplane.Path
	Capacity() (used, max int)
}

// portTabler is implemented by the XDP data plane: how many of its flows
// the program finds by port.
type portTabler interface {
	PortTableFlows() int
}

// collector reads the data planes, the call table and the CDR writer at
// scrape time.
type collector struct {
	mgr       *control.Manager
	observers []dataplane.Observer
	calls     *call.Table      // nil without the B2BUA
	cdr       func() cdr.Stats // nil without the B2BUA
	log       *zap.Logger
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{packetsDesc, bytesDesc, flowsDesc, attachedDesc, slotsUsedDesc, slotsMaxDesc, portTableDesc, redirectErrorsDesc, fallbackDesc,
		workerDelayDesc, workerWakeupsDesc, workerBatchesDesc, workerAFXDPDesc, workerAFXDPDropDesc, workerAFXDPFillDesc, workerLockWaitsDesc} {
		ch <- d
	}
	if c.calls != nil {
		ch <- portsDesc
	}
	if c.cdr != nil {
		for _, d := range []*prometheus.Desc{cdrWrittenDesc, cdrWriteErrorsDesc, cdrPostedDesc, cdrPostErrorsDesc, cdrDroppedDesc} {
			ch <- d
		}
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for path, n := range flowCounts(c.mgr, c.calls) {
		ch <- prometheus.MustNewConstMetric(flowsDesc, prometheus.GaugeValue, float64(n), string(path))
	}
	if c.calls != nil {
		for _, p := range c.calls.Registry().Ports() {
			name := cmp.Or(p.Interface, "default")
			ch <- prometheus.MustNewConstMetric(portsDesc, prometheus.GaugeValue, float64(2*(p.Pairs-p.Free)), name, "in_use")
			ch <- prometheus.MustNewConstMetric(portsDesc, prometheus.GaugeValue, float64(2*p.Free), name, "free")
		}
	}
	if c.cdr != nil {
		st := c.cdr()
		for _, m := range []struct {
			d *prometheus.Desc
			v uint64
		}{{cdrWrittenDesc, st.Written}, {cdrWriteErrorsDesc, st.WriteErrors}, {cdrPostedDesc, st.Posted}, {cdrPostErrorsDesc, st.PostErrors}, {cdrDroppedDesc, st.Dropped}} {
			ch <- prometheus.MustNewConstMetric(m.d, prometheus.CounterValue, float64(m.v))
		}
	}
	// Several observers may report the same verdict and reason: sum them,
	// since a metric may appear only once per label set.
	type key struct{ verdict, reason string }
	packets := make(map[key]uint64)
	bytes := make(map[key]uint64)
	var order []key
	attached := make(map[[2]string]float64)
	byPort, havePortTable := 0, false
	for _, o := range c.observers {
		if cp, ok := o.(capacity); ok {
			used, max := cp.Capacity()
			ch <- prometheus.MustNewConstMetric(slotsUsedDesc, prometheus.GaugeValue, float64(used), string(cp.Path()))
			ch <- prometheus.MustNewConstMetric(slotsMaxDesc, prometheus.GaugeValue, float64(max), string(cp.Path()))
		}
		if pt, ok := o.(portTabler); ok {
			byPort += pt.PortTableFlows()
			havePortTable = true
		}
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
			v := 1.0
			if i.Gone {
				v = 0
			}
			attached[[2]string{i.Name, i.Mode}] = v
		}
		if wo, ok := o.(dataplane.WorkerObserver); ok {
			collectWorkers(ch, wo.WorkerStats())
		}
		if eo, ok := o.(dataplane.EgressObserver); ok {
			for _, e := range eo.Egress() {
				fallback := 0.0
				if e.Fallback {
					fallback = 1
				}
				ch <- prometheus.MustNewConstMetric(redirectErrorsDesc, prometheus.CounterValue, float64(e.RedirectErrors), e.Device)
				ch <- prometheus.MustNewConstMetric(fallbackDesc, prometheus.GaugeValue, fallback, e.Device)
			}
		}
	}
	for _, k := range order {
		ch <- prometheus.MustNewConstMetric(packetsDesc, prometheus.CounterValue, float64(packets[k]), k.verdict, k.reason)
		ch <- prometheus.MustNewConstMetric(bytesDesc, prometheus.CounterValue, float64(bytes[k]), k.verdict, k.reason)
	}
	for k, v := range attached {
		ch <- prometheus.MustNewConstMetric(attachedDesc, prometheus.GaugeValue, v, k[0], k[1])
	}
	if havePortTable {
		ch <- prometheus.MustNewConstMetric(portTableDesc, prometheus.GaugeValue, float64(byPort))
	}
}

// collectWorkers sends the userspace workers' wake-ups and receive-queue
// delays.
func collectWorkers(ch chan<- prometheus.Metric, st dataplane.WorkerStats) {
	buckets := make(map[float64]uint64, len(dataplane.DelayBounds))
	var n uint64
	for i, b := range dataplane.DelayBounds {
		n += st.Delay[i]
		buckets[b] = n // cumulative
	}
	n += st.Delay[len(dataplane.DelayBounds)]
	ch <- prometheus.MustNewConstHistogram(workerDelayDesc, n, st.DelaySum.Seconds(), buckets)
	ch <- prometheus.MustNewConstMetric(workerWakeupsDesc, prometheus.CounterValue, float64(st.Wakeups), "socket")
	ch <- prometheus.MustNewConstMetric(workerWakeupsDesc, prometheus.CounterValue, float64(st.Naps), "nap")
	ch <- prometheus.MustNewConstMetric(workerWakeupsDesc, prometheus.CounterValue, float64(st.Interrupts), "signal")
	ch <- prometheus.MustNewConstMetric(workerBatchesDesc, prometheus.CounterValue, float64(st.Batches))
	ch <- prometheus.MustNewConstMetric(workerAFXDPDesc, prometheus.CounterValue, float64(st.AFXDP))
	ch <- prometheus.MustNewConstMetric(workerAFXDPDropDesc, prometheus.CounterValue, float64(st.AFXDPNoFrame), "no_frame")
	ch <- prometheus.MustNewConstMetric(workerAFXDPDropDesc, prometheus.CounterValue, float64(st.AFXDPRingFull), "rx_ring_full")
	ch <- prometheus.MustNewConstMetric(workerAFXDPFillDesc, prometheus.GaugeValue, float64(st.AFXDPFillFrames))
	ch <- prometheus.MustNewConstMetric(workerLockWaitsDesc, prometheus.CounterValue, float64(st.LockWaits))
	for i, n := range st.Flows {
		ch <- prometheus.MustNewConstMetric(workerFlowsDesc, prometheus.GaugeValue, float64(n), strconv.Itoa(i))
	}
}
