// Command relayctl talks to relayd's admin API (docs/api.md).
//
//	relayctl [-api URL|unix:/path] [--json] flows
//	relayctl flow get ID
//	relayctl flow add --match A:P [--send-from A:P --send-to A:P] [--expect-source A:P]
//	                  [--mode xdp|userspace] [--action forward|drop|reflect] [--clock-rate N]
//	                  [--rate-cap-pps N]
//	relayctl flow del ID
//	relayctl calls
//	relayctl call ID    (relayd's call id or either leg's SIP Call-ID)
//	relayctl hangup ID
//	relayctl drain [--timeout 10m] | drain --status
//	relayctl stats      (raw Prometheus metrics)
//	relayctl health
//	relayctl --version | --help
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayd/relayd/internal/secret"

	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/control/call"
)

const usage = `usage: relayctl [-api http://127.0.0.1:9900 | -api unix:/run/relayd/admin.sock] [-token-file FILE] [--json] COMMAND
commands:
  flows                      list flows
  flow get ID                show one flow
  flow add --match A:P [--send-from A:P] [--send-to A:P] [--expect-source A:P]
           [--mode xdp|userspace] [--action forward|drop|reflect] [--clock-rate N]
           [--rate-cap-pps N]
  flow del ID                remove a flow
  calls                      list calls in progress (SIP B2BUA)
  call ID                    show one call with its legs, attempts, flows and media (JSON);
                             ID is relayd's call id or the SIP Call-ID of either leg
  hangup ID                  end a call (BYE on both legs, CDR written)
  drain [--timeout 10m]      refuse new calls (503 with Retry-After); calls in progress go on
                             until they end or the timeout passes, then are hung up
  drain --status             whether a drain is on and how many calls remain
  stats                      print /metrics (Prometheus text)
  health                     check /healthz
  help                       print this help
options: --version, --help
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// usageError is a command line mistake: exit 2 with the usage.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("relayctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	api := fs.String("api", envOr("RELAYCTL_API", "http://127.0.0.1:9900"), "admin API: http://host:port or unix:/path/to.sock")
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	timeout := fs.Duration("timeout", 10*time.Second, "request timeout")
	showVersion := fs.Bool("version", false, "print the version and exit")
	tokenFile := fs.String("token-file", envOr("RELAYCTL_TOKEN_FILE", ""), "file with the admin API's bearer token (default "+defaultTokenFile+" when it exists)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			return 0
		}
		return 2
	}
	if *showVersion {
		fmt.Fprintln(stdout, "relayctl", getVersion())
		return 0
	}
	if fs.NArg() > 0 && (fs.Arg(0) == "help" || fs.Arg(0) == "--help" || fs.Arg(0) == "-h") {
		fmt.Fprint(stdout, usage)
		return 0
	}
	c, err := newClient(*api, *timeout)
	if err != nil {
		fmt.Fprintf(stderr, "relayctl: %v\n", err)
		return 2
	}
	if c.token, err = readToken(*tokenFile); err != nil {
		fmt.Fprintf(stderr, "relayctl: %v\n", err)
		return 2
	}
	err = dispatch(c, fs.Args(), *asJSON, stdout, stderr)
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "relayctl: %v\n%s", err, usage)
		return 2
	case err != nil:
		fmt.Fprintf(stderr, "relayctl: %v\n", err)
		return 1
	}
	return 0
}

// version is set at build time with -ldflags "-X main.version=...".
var version = ""

func getVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func dispatch(c *client, args []string, asJSON bool, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{"no command"}
	}
	// Allow --json after the command too.
	var rest []string
	for _, a := range args {
		if a == "--json" || a == "-json" {
			asJSON = true
			continue
		}
		rest = append(rest, a)
	}
	args = rest
	switch args[0] {
	case "flows":
		var l admin.FlowList
		if err := c.do("GET", "/v1/flows", nil, &l); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, l)
		}
		printFlows(stdout, l.Flows)
		return nil
	case "flow":
		if len(args) < 2 {
			return usageError{"flow: need get, add or del"}
		}
		return flowCmd(c, args[1], args[2:], asJSON, stdout, stderr)
	case "calls":
		var l admin.CallList
		if err := c.do("GET", "/v1/calls", nil, &l); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, l)
		}
		printCalls(stdout, l.Calls)
		return nil
	case "call":
		if len(args) != 2 {
			return usageError{"call: need a call id"}
		}
		var info call.Info
		if err := c.do("GET", "/v1/calls/"+url.PathEscape(args[1]), nil, &info); err != nil {
			return err
		}
		return printJSON(stdout, info)
	case "hangup":
		if len(args) != 2 {
			return usageError{"hangup: need a call id"}
		}
		var info call.Info
		if err := c.do("POST", "/v1/calls/"+url.PathEscape(args[1])+"/hangup", nil, &info); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, info)
		}
		fmt.Fprintf(stdout, "hung up %s (%s)\n", info.ID, info.Legs[call.A].CallID)
		return nil
	case "drain":
		return drainCmd(c, args[1:], asJSON, stdout)
	case "stats":
		body, err := c.raw("GET", "/metrics")
		if err != nil {
			return err
		}
		_, err = stdout.Write(body)
		return err
	case "health":
		var h map[string]any
		if err := c.do("GET", "/healthz", nil, &h); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, h)
		}
		fmt.Fprintf(stdout, "%v (version %v)\n", h["status"], h["version"])
		return nil
	}
	return usageError{fmt.Sprintf("unknown command %q", args[0])}
}

func drainCmd(c *client, args []string, asJSON bool, stdout io.Writer) error {
	fs := flag.NewFlagSet("drain", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	status := fs.Bool("status", false, "show the drain status")
	timeout := fs.Duration("timeout", admin.DefaultDrainTimeout, "how long calls in progress may go on")
	if err := fs.Parse(args); err != nil {
		return usageError{"drain: " + err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Sprintf("drain: unexpected arguments %q", fs.Args())}
	}
	var st admin.DrainStatus
	if *status {
		if err := c.do("GET", "/v1/drain", nil, &st); err != nil {
			return err
		}
	} else {
		if *timeout <= 0 {
			return usageError{"drain: --timeout must be positive"}
		}
		if err := c.do("POST", "/v1/drain", admin.DrainRequest{Timeout: timeout.String()}, &st); err != nil {
			return err
		}
	}
	if asJSON {
		return printJSON(stdout, st)
	}
	switch {
	case !*status:
		fmt.Fprintf(stdout, "draining: new calls get 503; %d calls in progress, hung up after %s\n", st.Calls, st.Timeout)
	case st.Draining:
		fmt.Fprintf(stdout, "draining: %d calls in progress\n", st.Calls)
	default:
		fmt.Fprintf(stdout, "not draining: %d calls in progress\n", st.Calls)
	}
	return nil
}

func flowCmd(c *client, sub string, args []string, asJSON bool, stdout, stderr io.Writer) error {
	switch sub {
	case "get", "del", "delete", "rm":
		if len(args) != 1 {
			return usageError{fmt.Sprintf("flow %s: need one flow ID", sub)}
		}
		id, err := strconv.ParseUint(args[0], 10, 64)
		if err != nil {
			return usageError{fmt.Sprintf("flow %s: %q is not a flow ID", sub, args[0])}
		}
		method := "GET"
		if sub != "get" {
			method = "DELETE"
		}
		var f admin.Flow
		if err := c.do(method, "/v1/flows/"+strconv.FormatUint(id, 10), nil, &f); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, f)
		}
		printFlows(stdout, []admin.Flow{f})
		return nil
	case "add":
		fs := flag.NewFlagSet("relayctl flow add", flag.ContinueOnError)
		fs.SetOutput(stderr)
		var req admin.FlowRequest
		fs.StringVar(&req.Match, "match", "", "relay `address:port` packets arrive on (required)")
		fs.StringVar(&req.SendFrom, "send-from", "", "relay `address:port` packets leave from")
		fs.StringVar(&req.SendTo, "send-to", "", "`address:port` packets go to")
		fs.StringVar(&req.ExpectSource, "expect-source", "", "only accept packets from `address:port` (port 0: any)")
		fs.StringVar(&req.Mode, "mode", "", "xdp (default) or userspace")
		fs.StringVar(&req.Action, "action", "", "forward (default), drop or reflect")
		clock := fs.Int64("clock-rate", -1, "RTP clock rate in Hz (default 8000; 0: no RTP statistics)")
		rateCap := fs.Int64("rate-cap-pps", -1, "packet-rate cap, packets per second (default media.rate_limit_default_pps; 0: none)")
		if err := fs.Parse(args); err != nil {
			return usageError{err.Error()}
		}
		if fs.NArg() > 0 {
			return usageError{fmt.Sprintf("flow add: unexpected arguments %q", fs.Args())}
		}
		if req.Match == "" {
			return usageError{"flow add: --match is required"}
		}
		if *clock >= 0 {
			if *clock > 1<<32-1 {
				return usageError{"flow add: --clock-rate too large"}
			}
			cr := uint32(*clock)
			req.ClockRate = &cr
		}
		if *rateCap >= 0 {
			if *rateCap > 1<<32-1 {
				return usageError{"flow add: --rate-cap-pps too large"}
			}
			rc := uint32(*rateCap)
			req.RateCapPPS = &rc
		}
		var f admin.Flow
		if err := c.do("POST", "/v1/flows", req, &f); err != nil {
			return err
		}
		if asJSON {
			return printJSON(stdout, f)
		}
		printFlows(stdout, []admin.Flow{f})
		return nil
	}
	return usageError{fmt.Sprintf("flow: unknown subcommand %q", sub)}
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func printFlows(w io.Writer, flows []admin.Flow) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tMATCH\tEXPECT_SOURCE\tSEND_FROM\tSEND_TO\tACTION\tPATH\tPACKETS\tBYTES\tDROPPED\tLOST\tJITTER_MS\tLAST_SEEN")
	for _, f := range flows {
		last := "-"
		if f.LastSeen != nil {
			last = *f.LastSeen
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%.3f\t%s\n", f.ID, f.Match, dash(f.ExpectSource),
			dash(f.SendFrom), dash(f.SendTo), f.Action, f.Path, f.Packets, f.Bytes, f.Dropped, f.Lost, f.JitterMS, last)
	}
	tw.Flush()
}

func printCalls(w io.Writer, calls []call.Info) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tFROM\tTO\tROUTE\tATTEMPTS\tDURATION_S\tPACKETS_A\tPACKETS_B\tPATH")
	for _, c := range calls {
		path := c.Media[call.A].Path
		if p := c.Media[call.B].Path; p != "" && p != path {
			path += "/" + p
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%.1f\t%d\t%d\t%s\n", c.ID, c.State, c.From, c.To, dash(c.Route),
			len(c.Attempts), c.DurationS, c.Media[call.A].Packets, c.Media[call.B].Packets, dash(path))
	}
	tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// client calls the admin API over TCP or a unix socket.
type client struct {
	base  string
	hc    *http.Client
	token string // bearer token; "" sends none
}

// defaultTokenFile is where the packaged relayd.toml's admin.token_file
// points when an operator turns the token on (a variable for tests).
var defaultTokenFile = "/etc/relayd/admin.token"

// readToken reads the bearer token from path; with no path, from
// defaultTokenFile if it exists and this user may read it (relayd asks
// for a token only when configured to, so none is fine).
func readToken(path string) (string, error) {
	if path == "" {
		t, err := secret.ReadToken(defaultTokenFile)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", defaultTokenFile, err)
		}
		return t, nil
	}
	t, err := secret.ReadToken(path)
	if err != nil {
		return "", fmt.Errorf("-token-file: %w", err)
	}
	return t, nil
}

func newClient(api string, timeout time.Duration) (*client, error) {
	if path, ok := strings.CutPrefix(api, "unix:"); ok {
		if path == "" {
			return nil, errors.New("-api unix: needs a socket path")
		}
		tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", path)
		}}
		return &client{base: "http://relayd", hc: &http.Client{Transport: tr, Timeout: timeout}}, nil
	}
	if !strings.HasPrefix(api, "http://") && !strings.HasPrefix(api, "https://") {
		api = "http://" + api
	}
	return &client{base: strings.TrimRight(api, "/"), hc: &http.Client{Timeout: timeout}}, nil
}

func (c *client) raw(method, path string) ([]byte, error) {
	req, err := http.NewRequest(method, c.base+path, nil)
	if err != nil {
		return nil, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		return nil, apiError(resp.StatusCode, body)
	}
	return body, nil
}

// do sends in (if not nil) as JSON and decodes the answer into out.
func (c *client) do(method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode request: %w", err)
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, c.base+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	if resp.StatusCode >= 300 {
		return apiError(resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// apiError is the API's {"error": ...} message, or the status if the
// body has none.
func apiError(code int, body []byte) error {
	var e admin.ErrorBody
	if json.Unmarshal(body, &e) == nil && e.Error != "" {
		if code == http.StatusUnauthorized {
			return fmt.Errorf("%s; relayctl reads it from -token-file, $RELAYCTL_TOKEN_FILE or %s", e.Error, defaultTokenFile)
		}
		return errors.New(e.Error)
	}
	return fmt.Errorf("%d %s", code, http.StatusText(code))
}
