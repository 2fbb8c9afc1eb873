package ngclient

import (
	"net/netip"
	"sort"
	"time"

	"github.com/relayd/relayd/control/ng/bencode"
)

// Counters count the packets a relay received on a stream, or on all
// streams of a call.
type Counters struct {
	Packets, Bytes, Errors int64
}

// StreamStats describes one stream (one relay socket) of a call as
// rtpengine's query reports it under tags/TAG/medias/N/streams.
type StreamStats struct {
	Tag        string         // the party (from-tag or to-tag) that sends to this socket
	Media      int            // index of the m= line, from 1
	RTCP       bool           // an RTCP socket (flag "RTCP"), else RTP
	Local      netip.AddrPort // the relay's socket: where Tag sends
	Endpoint   netip.AddrPort // the party's address as the relay knows it
	LastPacket time.Time
	Counters   // received on Local
}

// CallStats is the reply to query, or to delete when the server includes
// statistics (rtpengine does only when the call lingers, that is with a
// delete delay).
type CallStats struct {
	Created time.Time // zero if not reported
	// RTP and RTCP are the call's totals (totals/RTP, totals/RTCP).
	RTP, RTCP Counters
	// Streams lists the streams, sorted by tag, media and port.
	Streams []StreamStats
	Raw     bencode.Value // the whole reply
}

// Stream returns the RTP stream of tag's media index media (from 1), and
// whether there is one.
func (s *CallStats) Stream(tag string, media int) (StreamStats, bool) {
	for _, st := range s.Streams {
		if st.Tag == tag && st.Media == media && !st.RTCP {
			return st, true
		}
	}
	return StreamStats{}, false
}

func parseStats(v bencode.Value) *CallStats {
	s := &CallStats{Raw: v}
	if sec, ok := v.GetInt("created"); ok {
		us, _ := v.GetInt("created_us")
		s.Created = time.Unix(sec, us*1000)
	}
	totals, _ := v.Get("totals")
	if rtp, ok := totals.Get("RTP"); ok {
		s.RTP = parseCounters(rtp)
	}
	if rtcp, ok := totals.Get("RTCP"); ok {
		s.RTCP = parseCounters(rtcp)
	}
	tags, _ := v.Get("tags")
	for tagKey, tag := range tags.Entries() {
		name := tag.GetString("tag")
		if name == "" {
			name = tagKey
		}
		medias, _ := tag.Get("medias")
		ml, _ := medias.AsList()
		for _, m := range ml {
			index, _ := m.GetInt("index")
			streams, _ := m.Get("streams")
			sl, _ := streams.AsList()
			for _, st := range sl {
				ss := StreamStats{Tag: name, Media: int(index)}
				flags, _ := st.Get("flags")
				fl, _ := flags.AsList()
				for _, f := range fl {
					if f, _ := f.AsString(); f == "RTCP" {
						ss.RTCP = true
					}
				}
				port, _ := st.GetInt("local port")
				if a, err := netip.ParseAddr(st.GetString("local address")); err == nil && port > 0 && port < 65536 {
					ss.Local = netip.AddrPortFrom(a, uint16(port))
				}
				ep, _ := st.Get("endpoint")
				port, _ = ep.GetInt("port")
				if a, err := netip.ParseAddr(ep.GetString("address")); err == nil && port > 0 && port < 65536 {
					ss.Endpoint = netip.AddrPortFrom(a, uint16(port))
				}
				if t, ok := st.GetInt("last packet"); ok {
					ss.LastPacket = time.Unix(t, 0)
				}
				if c, ok := st.Get("stats"); ok {
					ss.Counters = parseCounters(c)
				}
				s.Streams = append(s.Streams, ss)
			}
		}
	}
	sort.Slice(s.Streams, func(i, j int) bool {
		a, b := s.Streams[i], s.Streams[j]
		if a.Tag != b.Tag {
			return a.Tag < b.Tag
		}
		if a.Media != b.Media {
			return a.Media < b.Media
		}
		return a.Local.Port() < b.Local.Port()
	})
	return s
}

func parseCounters(v bencode.Value) Counters {
	var c Counters
	c.Packets, _ = v.GetInt("packets")
	c.Bytes, _ = v.GetInt("bytes")
	c.Errors, _ = v.GetInt("errors")
	return c
}
