package ng

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
)

// dict is a reply dictionary built entry by entry: keys and values
// alternating, made a Value without a copy.
type dict []bencode.Value

// newDict returns a dict with room for n entries.
func newDict(n int) dict { return make(dict, 0, 2*n) }

func (d *dict) add(k string, v bencode.Value) { *d = append(*d, bencode.String(k), v) }
func (d *dict) str(k, v string)               { d.add(k, bencode.String(v)) }
func (d *dict) int(k string, v int64)         { d.add(k, bencode.Int(v)) }
func (d dict) value() bencode.Value           { return bencode.DictOf(d) }

func unixSec(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

// familyName is rtpengine's socket family name.
func familyName(a netip.Addr) string {
	if a.Is4() || a.Is4In6() {
		return "IPv4"
	}
	return "IPv6"
}

func endpointValue(ap netip.AddrPort) bencode.Value {
	if !ap.IsValid() {
		return bencode.DictOf(nil)
	}
	d := newDict(3)
	d.str("family", familyName(ap.Addr()))
	d.str("address", ap.Addr().Unmap().String())
	d.int("port", int64(ap.Port()))
	return d.value()
}

func countersValue(c Counters) bencode.Value {
	return bencode.Dict(
		bencode.Entry{Key: "packets", Value: bencode.Int(c.Packets)},
		bencode.Entry{Key: "bytes", Value: bencode.Int(c.Bytes)},
		bencode.Entry{Key: "errors", Value: bencode.Int(c.Errors)},
	)
}

func (c *Counters) addTo(o Counters) {
	c.Packets += o.Packets
	c.Bytes += o.Bytes
	c.Errors += o.Errors
}

func subscriptionsValue(subs []Subscription) bencode.Value {
	l := make([]bencode.Value, len(subs))
	for i, s := range subs {
		typ := s.Type
		if typ == "" {
			typ = "offer/answer"
		}
		l[i] = bencode.Dict(bencode.Entry{Key: "tag", Value: bencode.String(s.Tag)}, bencode.Entry{Key: "type", Value: bencode.String(typ)})
	}
	return bencode.List(l...)
}

func mosValue(m MOS, samples int) bencode.Value {
	d := newDict(6)
	d.int("MOS", m.MOS)
	d.int("round-trip time", m.RoundTrip)
	d.int("round-trip time leg", m.RoundTripLeg)
	d.int("jitter", m.Jitter)
	d.int("packet loss", m.PacketLoss)
	if samples > 0 {
		d.int("samples", int64(samples))
	} else {
		d.int("reported at", unixSec(m.ReportedAt))
	}
	return d.value()
}

// callStatsEntries returns the entries of a query (or delete) reply in
// ng_call_stats's layout.
func callStatsEntries(c *CallStats) dict {
	d := newDict(8) // and the reply's result (encodeReply)
	d.int("created", unixSec(c.Created))
	if c.Created.IsZero() {
		d.int("created_us", 0)
	} else {
		d.int("created_us", int64(c.Created.Nanosecond()/1000))
	}
	d.int("last signal", unixSec(c.LastSignal))

	ssrc := newDict(len(c.SSRC))
	seen := map[string]bool{}
	for _, s := range c.SSRC {
		key := strconv.FormatUint(uint64(s.SSRC), 10)
		if seen[key] {
			continue
		}
		seen[key] = true
		e := newDict(5)
		e.int("cumulative loss", s.CumulativeLoss)
		e.add("average MOS", mosValue(s.Average, max(s.Samples, 1)))
		e.add("lowest MOS", mosValue(s.Lowest, 0))
		e.add("highest MOS", mosValue(s.Highest, 0))
		prog := make([]bencode.Value, len(s.Progression))
		for i, m := range s.Progression {
			prog[i] = mosValue(m, 0)
		}
		e.add("MOS progression", bencode.Dict(
			bencode.Entry{Key: "interval", Value: bencode.Int(int64(s.ProgressionInterval / time.Second))},
			bencode.Entry{Key: "entries", Value: bencode.List(prog...)},
		))
		ssrc.add(key, e.value())
	}
	d.add("SSRC", ssrc.value())

	var rtp, rtcp Counters
	tags := newDict(len(c.Tags))
	tagSeen := map[string]bool{}
	for i, t := range c.Tags {
		key := t.Tag
		if key == "" {
			key = fmt.Sprintf("<untagged %d>", i)
		}
		if tagSeen[key] {
			continue
		}
		tagSeen[key] = true
		td := newDict(8)
		td.str("tag", t.Tag)
		if t.ViaBranch != "" {
			td.str("via-branch", t.ViaBranch)
		}
		if t.Label != "" {
			td.str("label", t.Label)
		}
		td.int("created", unixSec(t.Created))
		td.add("subscriptions", subscriptionsValue(t.Subscriptions))
		td.add("subscribers", subscriptionsValue(t.Subscribers))
		medias := make([]bencode.Value, len(t.Medias))
		for j, m := range t.Medias {
			md := newDict(6)
			md.int("index", int64(m.Index))
			md.str("type", m.Type)
			if m.Protocol != "" {
				md.str("protocol", m.Protocol)
			}
			if m.Codec != "" {
				md.str("codec", m.Codec)
			}
			streams := make([]bencode.Value, len(m.Streams))
			for k, s := range m.Streams {
				sd := newDict(10)
				if s.Local.IsValid() {
					sd.int("local port", int64(s.Local.Port()))
					sd.str("local address", s.Local.Addr().Unmap().String())
					sd.str("family", familyName(s.Local.Addr()))
				}
				sd.add("endpoint", endpointValue(s.Endpoint))
				sd.add("advertised endpoint", endpointValue(s.Advertised))
				if s.CryptoSuite != "" {
					sd.str("crypto suite", s.CryptoSuite)
				}
				sd.int("last packet", unixSec(s.LastPacket))
				sd.add("flags", bencode.Strings(s.Flags...))
				if s.SSRC != 0 {
					sd.int("SSRC", int64(s.SSRC))
				}
				sd.add("stats", countersValue(s.Stats))
				streams[k] = sd.value()
				if hasString(s.Flags, "RTP") {
					rtp.addTo(s.Stats)
				} else {
					rtcp.addTo(s.Stats)
				}
			}
			md.add("streams", bencode.List(streams...))
			md.add("flags", bencode.Strings(m.Flags...))
			medias[j] = md.value()
		}
		td.add("medias", bencode.List(medias...))
		tags.add(key, td.value())
	}
	d.add("tags", tags.value())
	if c.TotalRTP != (Counters{}) || c.TotalRTCP != (Counters{}) {
		rtp, rtcp = c.TotalRTP, c.TotalRTCP
	}
	d.add("totals", bencode.Dict(
		bencode.Entry{Key: "RTP", Value: countersValue(rtp)},
		bencode.Entry{Key: "RTCP", Value: countersValue(rtcp)},
	))
	return d
}

func hasString(l []string, s string) bool {
	for _, e := range l {
		if e == s {
			return true
		}
	}
	return false
}

// seconds formats a duration as rtpengine's statistics do: seconds with
// six decimals.
func seconds(d time.Duration) bencode.Value {
	return bencode.String(strconv.FormatFloat(d.Seconds(), 'f', 6, 64))
}

// statisticsEntries returns the "statistics" dictionary.
func statisticsEntries(s *Statistics, control bencode.Value) bencode.Value {
	var cur dict
	cur.int("sessionsown", s.SessionsOwn)
	cur.int("sessionsforeign", s.SessionsForeign)
	cur.int("sessionstotal", s.SessionsOwn+s.SessionsForeign)
	cur.int("transcodedmedia", s.TranscodedMedia)
	cur.int("packetrate_user", s.PacketRate)
	cur.int("byterate_user", s.ByteRate)
	cur.int("errorrate_user", s.ErrorRate)
	cur.int("packetrate_kernel", 0)
	cur.int("byterate_kernel", 0)
	cur.int("errorrate_kernel", 0)
	cur.int("packetrate", s.PacketRate)
	cur.int("byterate", s.ByteRate)
	cur.int("errorrate", s.ErrorRate)
	cur.int("media_userspace", 0)
	cur.int("media_kernel", 0)
	cur.int("media_mixed", 0)

	var tot dict
	tot.str("uptime", strconv.FormatInt(int64(s.Uptime/time.Second), 10))
	tot.int("managedsessions", s.ManagedSessions)
	tot.int("rejectedsessions", s.RejectedSessions)
	tot.int("timeoutsessions", s.TimeoutSessions)
	tot.int("silenttimeoutsessions", s.SilentTimeoutSessions)
	tot.int("finaltimeoutsessions", s.FinalTimeoutSessions)
	tot.int("offertimeoutsessions", s.OfferTimeoutSessions)
	tot.int("regularterminatedsessions", s.RegularTerminatedSessions)
	tot.int("forcedterminatedsessions", s.ForcedTerminatedSessions)
	tot.int("relayedpackets_user", s.RelayedPackets)
	tot.int("relayedpacketerrors_user", s.RelayedPacketErrors)
	tot.int("relayedbytes_user", s.RelayedBytes)
	tot.int("relayedpackets_kernel", 0)
	tot.int("relayedpacketerrors_kernel", 0)
	tot.int("relayedbytes_kernel", 0)
	tot.int("relayedpackets", s.RelayedPackets)
	tot.int("relayedpacketerrors", s.RelayedPacketErrors)
	tot.int("relayedbytes", s.RelayedBytes)
	tot.int("zerowaystreams", s.ZeroWayStreams)
	tot.int("onewaystreams", s.OneWayStreams)
	tot.add("avgcallduration", seconds(s.AverageCallDuration))
	tot.add("totalcallsduration", seconds(s.TotalCallsDuration))
	tot.add("totalcallsduration2", seconds(0))
	tot.add("totalcallsduration_stddev", seconds(0))

	var mos dict
	mos.add("mos_total", seconds(0))
	mos.add("mos2_total", seconds(0))
	mos.int("mos_samples_total", 0)
	mos.add("mos_average", seconds(0))
	mos.add("mos_stddev", seconds(0))

	ifs := make([]bencode.Value, len(s.Interfaces))
	for i, in := range s.Interfaces {
		total := in.PortMax - in.PortMin + 1
		if total < 0 {
			total = 0
		}
		pct := 0.0
		if total > 0 {
			pct = 100 * float64(in.PortsUsed) / float64(total)
		}
		var ports dict
		ports.int("min", int64(in.PortMin))
		ports.int("max", int64(in.PortMax))
		ports.int("used", int64(in.PortsUsed))
		ports.str("used_pct", strconv.FormatFloat(pct, 'f', 2, 64))
		ports.int("free", int64(total-in.PortsUsed))
		ports.int("totals", int64(total))
		ports.int("last", int64(in.LastPort))
		var d dict
		d.str("name", in.Name)
		d.str("address", in.Address.String())
		d.add("ports", ports.value())
		ifs[i] = d.value()
	}

	var st dict
	st.add("currentstatistics", cur.value())
	st.add("totalstatistics", tot.value())
	st.add("mos", mos.value())
	if control.IsValid() {
		st.add("controlstatistics", control)
	}
	st.add("interfaces", bencode.List(ifs...))
	return st.value()
}
