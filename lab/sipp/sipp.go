// Package sipp holds the SIPp scenarios of the lab's tests and benchmarks
// as XML files (scenarios/*.xml, embedded), one file per call flow, and
// writes them where SIPp (Debian package sip-tester) can load them with
// -sf.
//
// A scenario takes its parameters the way SIPp does where SIPp can: -key
// for a keyword ([audio], [sdp_port]), -set for one of its <Global>
// variables (a flag that picks a branch, like late_offer), -d for the
// duration of a <pause/> without milliseconds (a call's hold). Where SIPp
// cannot (a status code in a response's status line), the file holds a
// text/template action ({{.code}}) that Scenario fills in. Each file's
// opening comment lists its parameters.
//
// The scenarios:
//
//	uac.xml           a call with audio, early or late offer, through a proxy or a B2BUA
//	uas.xml           its callee: answers with SDP (plain, or SDES with -set sdes 1)
//	uac_cancel.xml    a call canceled while it rings
//	uas_ring.xml      its callee: rings, then 200 to the CANCEL and 487
//	uac_rejected.xml  a call rejected with 486
//	reject.xml        a callee that rejects with {{.code}}
//	uac_wait_bye.xml  a call with audio that the callee hangs up
//	uas_bye.xml       its callee: answers, holds for -d, sends the BYE
//	uac_hold.xml      a call with audio put on hold and resumed by re-INVITEs
//	uas_hold.xml      its callee: checks a=sendonly, then a=sendrecv
//	uac_pcmu_pcap.xml a call offering PCMU and telephone-event only that plays a pcap (-key pcap)
//	uac_g729_pcap.xml a call offering G.729 (annexb=no) and telephone-event only that plays a pcap
//	uac_pcmu_sdes.xml a call offering PCMU over SRTP (-key crypto) whose media another program sends
//	uas_g729.xml      a callee answering G.729 (annexb=no) and telephone-event that plays a pcap
//	uas_pcmu.xml      a callee answering PCMU and telephone-event that plays a pcap
//	uac_refused.xml   a call relayd refuses before routing it with {{.code}} (403, 401)
//	uac_auth.xml      a call that answers relayd's digest challenge, then expects {{.final}}
//	uac_bench.xml     a call without media, hung up after -d, for SIP benchmarks through a proxy or a B2BUA
//	uas_bench.xml     its callee: rings and answers, as SIPp's built-in uas does, behind a proxy too
//
// WAV makes the audio file the callers' rtp_stream plays; lab/audio's
// WritePcap the captures play_pcap_audio plays (which needs root: SIPp
// sends them through a raw socket).
package sipp

import (
	"bytes"
	"embed"
	"encoding/binary"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"text/template"
	"time"
)

//go:embed scenarios/*.xml
var files embed.FS

// Names returns the names of the embedded scenarios ("uac.xml", ...), in
// lexical order.
func Names() []string {
	ents, err := fs.ReadDir(files, "scenarios")
	if err != nil {
		panic(err) // the embedded directory exists: go:embed checked it
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// Scenario returns the XML of the named scenario with its template
// actions ({{.code}}) filled in from vars. A scenario without template
// actions comes back as it is stored, whatever vars holds; a missing value
// is an error, an unused one is not.
func Scenario(name string, vars map[string]string) ([]byte, error) {
	b, err := files.ReadFile(path.Join("scenarios", name))
	if err != nil {
		return nil, fmt.Errorf("sipp scenario %q: %w", name, err)
	}
	if !bytes.Contains(b, []byte("{{")) {
		return b, nil
	}
	tmpl, err := template.New(name).Option("missingkey=error").Parse(string(b))
	if err != nil {
		return nil, fmt.Errorf("sipp scenario %q: %w", name, err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, vars); err != nil {
		return nil, fmt.Errorf("sipp scenario %q: %w", name, err)
	}
	return out.Bytes(), nil
}

// WriteFile writes the named scenario, filled in from vars as Scenario
// does, into dir under its name and returns the file's path.
func WriteFile(dir, name string, vars map[string]string) (string, error) {
	b, err := Scenario(name, vars)
	if err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		return "", fmt.Errorf("sipp scenario: %w", err)
	}
	return p, nil
}

// WAV returns a G.711 µ-law WAV file of d of audio (a fixed, non-silent
// pattern) for rtp_stream: -key audio PATH,LOOPS,0.
func WAV(d time.Duration) []byte {
	n := int(d.Seconds() * 8000)
	var b bytes.Buffer
	le := binary.LittleEndian
	u16 := func(v uint16) { b.Write(le.AppendUint16(nil, v)) }
	u32 := func(v uint32) { b.Write(le.AppendUint32(nil, v)) }
	b.WriteString("RIFF")
	u32(uint32(4 + 26 + 8 + 12 + 8 + n))
	b.WriteString("WAVEfmt ")
	u32(18)
	u16(7) // WAVE_FORMAT_MULAW
	u16(1) // channels
	u32(8000)
	u32(8000) // bytes per second
	u16(1)    // block align
	u16(8)    // bits per sample
	u16(0)    // extension size
	b.WriteString("fact")
	u32(4)
	u32(uint32(n))
	b.WriteString("data")
	u32(uint32(n))
	for i := range n {
		b.WriteByte(byte(0x55 + i%7))
	}
	return b.Bytes()
}
