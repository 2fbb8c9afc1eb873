package sipp

import (
	"bytes"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/lab/audio"
)

// testVars fills the template actions of every scenario.
var testVars = map[string]string{"code": "486", "final": "200"}

// parsed is what checkXML reads from a scenario.
type parsed struct {
	root    string
	globals []string // <Global variables="...">
	labels  []string // <label id="...">
	nexts   []string // next="..." of any element
}

// checkXML decodes a scenario to its end, failing on XML that is not well
// formed.
func checkXML(t *testing.T, name string, b []byte) parsed {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(b))
	d.CharsetReader = func(charset string, r io.Reader) (io.Reader, error) {
		if !strings.EqualFold(charset, "ISO-8859-1") {
			return nil, fmt.Errorf("charset %q", charset)
		}
		return r, nil // the files are ASCII, checked below
	}
	for i, c := range b {
		if c >= 0x80 {
			t.Fatalf("%s: byte %d is %#x, not ASCII", name, i, c)
		}
	}
	var p parsed
	for {
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		se, ok := tok.(xml.StartElement)
		if !ok {
			continue
		}
		if p.root == "" {
			p.root = se.Name.Local
		}
		for _, a := range se.Attr {
			switch {
			case se.Name.Local == "Global" && a.Name.Local == "variables":
				p.globals = append(p.globals, strings.Split(a.Value, ",")...)
			case se.Name.Local == "label" && a.Name.Local == "id":
				p.labels = append(p.labels, a.Value)
			case a.Name.Local == "next":
				p.nexts = append(p.nexts, a.Value)
			}
		}
	}
	return p
}

func TestScenariosWellFormed(t *testing.T) {
	names := Names()
	if len(names) < 10 {
		t.Fatalf("%d scenarios embedded: %q", len(names), names)
	}
	for _, name := range names {
		b, err := Scenario(name, testVars)
		if err != nil {
			t.Fatal(err)
		}
		p := checkXML(t, name, b)
		if p.root != "scenario" {
			t.Errorf("%s: root element %q, want scenario", name, p.root)
		}
		for _, n := range p.nexts {
			if !strings.Contains(strings.Join(p.labels, "\x00")+"\x00", n+"\x00") {
				t.Errorf("%s: next=%q names no label (labels %q)", name, n, p.labels)
			}
		}
		if !bytes.Contains(b, []byte("<!--\n  "+name+":")) {
			t.Errorf("%s: no opening comment that says what it does", name)
		}
	}
}

func TestScenarioTemplate(t *testing.T) {
	b, err := Scenario("reject.xml", map[string]string{"code": "503", "unused": "x"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(b, []byte("\nSIP/2.0 503 Rejected\n")) || bytes.Contains(b, []byte("{{")) {
		t.Errorf("reject.xml with code 503:\n%s", b)
	}
	if _, err := Scenario("reject.xml", nil); err == nil {
		t.Error("reject.xml without a code: no error")
	}
	if _, err := Scenario("nosuch.xml", nil); err == nil {
		t.Error("nosuch.xml: no error")
	}
	// Without template actions a scenario is the file as stored.
	want, err := os.ReadFile(filepath.Join("scenarios", "uac.xml"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := Scenario("uac.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("uac.xml (-file +Scenario):\n%s", diff)
	}
	dir := t.TempDir()
	p, err := WriteFile(dir, "reject.xml", map[string]string{"code": "404"})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(p); err != nil || !bytes.Contains(b, []byte("SIP/2.0 404 Rejected")) || p != filepath.Join(dir, "reject.xml") {
		t.Errorf("WriteFile wrote %s: %v\n%s", p, err, b)
	}
}

func TestWAV(t *testing.T) {
	b := WAV(2 * time.Second)
	if len(b) != 58+16000 || string(b[:4]) != "RIFF" || string(b[8:16]) != "WAVEfmt " || string(b[50:54]) != "data" {
		t.Errorf("WAV of 2 s: %d bytes, header %q", len(b), b[:min(len(b), 58)])
	}
}

// sippError is how SIPp prints an error (or a warning): a time stamp, a
// tab, the epoch time and the message.
var sippError = regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\d\t[0-9:.]+\t[0-9.]+: .*$`)

// sippLoad has SIPp load scenario file path with args and exit without
// placing or taking a call (-m 0); it returns the errors SIPp printed.
func sippLoad(t *testing.T, sipp, path string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// 127.0.0.1:9 is only a remote address to parse: with -m 0 SIPp
	// sends nothing.
	args = append([]string{"-sf", path, "127.0.0.1:9", "-i", "127.0.0.1", "-p", "0", "-mp", "0", "-m", "0", "-nostdin"}, args...)
	cmd := exec.CommandContext(ctx, sipp, args...)
	cmd.Dir = t.TempDir()
	out, err := cmd.CombinedOutput()
	errs := strings.Join(sippError.FindAllString(string(out), -1), "\n")
	if err != nil && errs == "" {
		errs = fmt.Sprintf("sipp %q: %v\n%s", args, err, out)
	}
	return errs
}

// TestSIPpLoads: SIPp loads every scenario, with every one of its global
// flags unset and set, and refuses a broken one.
func TestSIPpLoads(t *testing.T) {
	sipp := testenv.NeedCommand(t, "sipp", "sip-tester")
	dir := t.TempDir()
	wav := filepath.Join(dir, "audio.wav")
	if err := os.WriteFile(wav, WAV(time.Second), 0o644); err != nil {
		t.Fatal(err)
	}
	// SIPp reads a play_pcap_audio capture when it loads the scenario.
	pcap := filepath.Join(dir, "audio.pcap")
	pkts := audio.RTPPackets(audio.RTPStream{
		Src: netip.MustParseAddrPort("198.18.0.1:7000"), Dst: netip.MustParseAddrPort("198.18.0.2:7002"),
		Samples: 160, Interval: 20 * time.Millisecond,
	}, audio.Chunk(make([]byte, 800), 160))
	if err := audio.WritePcap(pcap, pkts); err != nil {
		t.Fatal(err)
	}
	keys := []string{"-key", "audio", wav + ",1,0", "-key", "sdp_port", "7000", "-key", "pcap", pcap,
		"-key", "crypto", "1 AES_CM_128_HMAC_SHA1_80 inline:WVNfX19zZW1jdGwgKCkgewkyMjA7fQp9CnVubGVz"}
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			b, err := Scenario(name, testVars)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			if errs := sippLoad(t, sipp, path, keys...); errs != "" {
				t.Errorf("sipp refuses %s:\n%s", name, errs)
			}
			for _, g := range checkXML(t, name, b).globals {
				if errs := sippLoad(t, sipp, path, append(keys, "-set", g, "1")...); errs != "" {
					t.Errorf("sipp refuses %s with -set %s 1:\n%s", name, g, errs)
				}
			}
		})
	}
	// The check can fail: a status code out of range, a keyword not
	// supplied, an unknown element.
	bad := map[string][]byte{}
	if b, err := Scenario("reject.xml", map[string]string{"code": "99"}); err == nil {
		bad["reject.xml with code 99"] = b
	}
	uac, _ := Scenario("uac.xml", nil)
	bad["uac.xml with <pausex/>"] = bytes.Replace(uac, []byte("<pause/>"), []byte("<pausex/>"), 1)
	for what, b := range bad {
		path := filepath.Join(t.TempDir(), "bad.xml")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if errs := sippLoad(t, sipp, path, keys...); errs == "" {
			t.Errorf("sipp loads %s", what)
		}
	}
	if errs := sippLoad(t, sipp, filepath.Join("scenarios", "uac.xml")); errs == "" {
		t.Error("sipp loads uac.xml without -key audio")
	}
}
