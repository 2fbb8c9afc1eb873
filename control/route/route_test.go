package route

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap/zaptest"

	"github.com/relayd/relayd/config"
)

func parseConfig(t *testing.T, extra string) *config.Config {
	t.Helper()
	c, err := config.Parse([]byte("[dataplane]\nmode = \"userspace\"\n[media]\naddress = \"198.18.1.1\"\n" + extra))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func uris(ds []Destination) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.URI)
	}
	return out
}

func TestParseDestination(t *testing.T) {
	d, err := ParseDestination("sip:+1555@[2001:2:0:2::2]:5070;transport=TCP")
	if err != nil {
		t.Fatal(err)
	}
	if d.User != "+1555" || d.Host != "2001:2:0:2::2" || d.Port != 5070 || d.Transport != "tcp" || d.HostPort() != "[2001:2:0:2::2]:5070" {
		t.Errorf("%+v", d)
	}
	d, _ = ParseDestination("sip:198.18.2.2")
	if d.HostPort() != "198.18.2.2:5060" || d.Transport != "udp" {
		t.Errorf("%+v", d)
	}
	d, _ = ParseDestination("sip:198.18.2.2;transport=tls")
	if d.HostPort() != "198.18.2.2:5061" || d.Transport != "tls" {
		t.Errorf("TLS destination %+v, want port 5061", d)
	}
	for _, bad := range []string{"", "tel:1", "sip:", "sip:h:0", "sip:h:x", "sip:[::1", "sip:h;transport=sctp"} {
		if _, err := ParseDestination(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestLookupLocal(t *testing.T) {
	c := parseConfig(t, `
[[route]]
name = "us"
match = "^\\+?1"
destinations = ["sip:198.18.2.2", "sip:198.18.3.2"]
failover_on = [503]
srtp = "require"
[[route]]
name = "random"
match = "^9"
destinations = ["sip:198.18.2.2", "sip:198.18.3.2", "sip:198.18.4.2"]
order = "random"
[[route]]
name = "weighted"
match = "^8"
destinations = ["sip:198.18.2.2", "sip:198.18.3.2"]
order = "weighted"
weights = [99, 1]
`)
	r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.Lookup(context.Background(), Facts{User: "+15551234"})
	if err != nil {
		t.Fatal(err)
	}
	if d.Route.Name != "us" || d.Route.SRTP != SRTPRequire || !d.Route.Fails(503) || d.Route.Fails(486) {
		t.Errorf("route %+v", d.Route)
	}
	if diff := cmp.Diff(uris(d.Destinations), []string{"sip:198.18.2.2", "sip:198.18.3.2"}); diff != "" {
		t.Errorf("ordered (-got +want):\n%s", diff)
	}
	if _, err := r.Lookup(context.Background(), Facts{User: "44"}); !errors.Is(err, ErrNoRoute) {
		t.Errorf("unmatched: %v, want ErrNoRoute", err)
	}
	firsts := make(map[string]int)
	for range 300 {
		d, _ := r.Lookup(context.Background(), Facts{User: "9"})
		if len(d.Destinations) != 3 {
			t.Fatalf("random lost destinations: %v", uris(d.Destinations))
		}
		firsts[d.Destinations[0].URI]++
	}
	if len(firsts) != 3 {
		t.Errorf("random order always starts with the same: %v", firsts)
	}
	heavy := 0
	for range 200 {
		d, _ := r.Lookup(context.Background(), Facts{User: "8"})
		if len(d.Destinations) != 2 {
			t.Fatalf("weighted lost destinations: %v", uris(d.Destinations))
		}
		if d.Destinations[0].URI == "sip:198.18.2.2" {
			heavy++
		}
	}
	if heavy < 180 {
		t.Errorf("weight 99 of 100 came first %d times of 200", heavy)
	}
}

func TestLookupServer(t *testing.T) {
	var mu sync.Mutex
	var got Facts
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f Facts
		json.NewDecoder(r.Body).Decode(&f)
		mu.Lock()
		got = f
		mu.Unlock()
		switch f.User {
		case "reject":
			json.NewEncoder(w).Encode(ServerResponse{Reject: 403, Reason: "Forbidden"})
		case "slow":
			time.Sleep(500 * time.Millisecond)
		case "garbage":
			w.Write([]byte("{"))
		case "down":
			w.WriteHeader(http.StatusBadGateway)
		case "g729":
			json.NewEncoder(w).Encode(ServerResponse{Destinations: []string{"sip:198.18.2.2"}, Transcode: []string{"g729"}})
		case "opus":
			json.NewEncoder(w).Encode(ServerResponse{Destinations: []string{"sip:198.18.2.2"}, Transcode: []string{"opus"}})
		default:
			json.NewEncoder(w).Encode(ServerResponse{Destinations: []string{"sip:198.18.3.2;transport=tcp", "sip:198.18.2.2"}, SRTP: "offer"})
		}
	}))
	defer srv.Close()
	c := parseConfig(t, "[route_server]\nurl = \""+srv.URL+"\"\ntimeout = \"100ms\"\n[[route]]\nname = \"local\"\nmatch = \"^1\"\nfailover_on = [486]\n")
	r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.Lookup(context.Background(), Facts{CallID: "x", User: "123"})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if got.Route != "local" || got.CallID != "x" {
		t.Errorf("server got %+v", got)
	}
	mu.Unlock()
	if d.Route.Name != "local" || !d.Route.Fails(486) || d.Route.SRTP != SRTPOffer || len(d.Destinations) != 2 || d.Destinations[0].Transport != "tcp" {
		t.Errorf("decision %+v", d)
	}
	// The server changed the table's route: calls keep their own copy.
	if sh := d.Shared(); sh.SRTP != SRTPOffer || sh == &r.tab.Load().routes[0] {
		t.Errorf("shared route %+v: want the server's change, not the table's route", sh)
	}
	d, err = r.Lookup(context.Background(), Facts{User: "555"})
	if err != nil || d.Route.Name != "route_server" {
		t.Errorf("no local route: %+v %v", d.Route, err)
	}
	var rej *Rejected
	if _, err := r.Lookup(context.Background(), Facts{User: "reject"}); !errors.As(err, &rej) || rej.Code != 403 {
		t.Errorf("reject: %v", err)
	}
	if d, err := r.Lookup(context.Background(), Facts{User: "g729"}); err != nil || len(d.Route.Transcode) != 1 || d.Route.Transcode[0] != "G729" {
		t.Errorf("transcode from the server: %q %v, want G729", d.Route.Transcode, err)
	}
	for _, user := range []string{"slow", "garbage", "down", "opus"} {
		start := time.Now()
		if _, err := r.Lookup(context.Background(), Facts{User: user}); !errors.Is(err, ErrServer) {
			t.Errorf("%s: %v, want ErrServer", user, err)
		}
		if time.Since(start) > 400*time.Millisecond {
			t.Errorf("%s: took %v with a 100ms timeout", user, time.Since(start))
		}
	}
}

// TestRouteTranscode: a route's transcode list reaches its decision.
func TestRouteTranscode(t *testing.T) {
	c := parseConfig(t, "[[route]]\nname = \"g729\"\nmatch = \".\"\ndestinations = [\"sip:198.18.2.2\"]\ncodecs = [\"PCMA\"]\ntranscode = [\"g729\"]\n")
	r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	d, err := r.Lookup(context.Background(), Facts{User: "1"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"G729"}, d.Route.Transcode); diff != "" {
		t.Errorf("transcode (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"PCMA"}, d.Route.Codecs); diff != "" {
		t.Errorf("codecs (-want +got):\n%s", diff)
	}
}

// TestReload: a reload replaces the routes for later lookups; a reload
// with a bad destination keeps the routes in use.
func TestReload(t *testing.T) {
	c := parseConfig(t, `
[[route]]
name = "old"
match = "^1"
destinations = ["sip:198.18.2.2"]
`)
	r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	c2 := parseConfig(t, `
[[route]]
name = "new"
match = "^2"
destinations = ["sip:198.18.3.2:5070"]
`)
	if err := r.Reload(c2.Routes, c2.RouteServer); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Lookup(context.Background(), Facts{User: "100"}); !errors.Is(err, ErrNoRoute) {
		t.Errorf("old route still answers after reload: %v", err)
	}
	d, err := r.Lookup(context.Background(), Facts{User: "200"})
	if err != nil || d.Route.Name != "new" || len(d.Destinations) != 1 || d.Destinations[0].HostPort() != "198.18.3.2:5070" {
		t.Errorf("after reload: %+v, %v", d, err)
	}
	bad := c2.Routes
	bad[0].Destinations = []string{"tel:1"}
	if err := r.Reload(bad, c2.RouteServer); err == nil {
		t.Error("reload with a bad destination accepted")
	}
	if d, err := r.Lookup(context.Background(), Facts{User: "200"}); err != nil || d.Route.Name != "new" {
		t.Errorf("failed reload changed the routes: %+v, %v", d, err)
	}
	if got := uris(r.Destinations()); len(got) != 1 {
		t.Errorf("destinations %v", got)
	}
}

// TestLookupAllow: routes are tried in order, and one whose allow list
// does not take the caller's address is skipped; a user that routes
// match but none takes from its source is ErrForbidden, also with a route
// server (which is not asked); a user no route matches goes to the route
// server, or is ErrNoRoute without one. A route without allow takes any
// source.
func TestLookupAllow(t *testing.T) {
	asked := make(chan Facts, 10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var f Facts
		json.NewDecoder(r.Body).Decode(&f)
		asked <- f
		json.NewEncoder(w).Encode(ServerResponse{Destinations: []string{"sip:198.18.5.2"}})
	}))
	defer srv.Close()
	routes := `
[[route]]
name = "pbx"
match = "^1"
allow = ["198.18.0.0/24", "2001:2::2"]
destinations = ["sip:198.18.2.2"]
[[route]]
name = "branch"
match = "^1"
allow = ["198.18.7.7"]
destinations = ["sip:198.18.3.2"]
[[route]]
name = "open"
match = "^2"
destinations = ["sip:198.18.4.2"]
`
	for _, withServer := range []bool{false, true} {
		doc := routes
		if withServer {
			doc += "[route_server]\nurl = \"" + srv.URL + "\"\n"
		}
		c := parseConfig(t, doc)
		r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			user, source, route string
			err                 error
		}{
			{"100", "198.18.0.2:5060", "pbx", nil},
			{"100", "[2001:2::2]:5060", "pbx", nil},
			{"100", "[::ffff:198.18.0.9]:5060", "pbx", nil},
			{"100", "198.18.7.7:5060", "branch", nil},
			{"100", "198.18.4.2:5060", "", ErrForbidden},
			{"100", "[2001:2::3]:5060", "", ErrForbidden},
			{"100", "", "", ErrForbidden},
			{"200", "203.0.113.9:5060", "open", nil},
		} {
			f := Facts{User: tc.user, Source: tc.source}
			d, err := r.Lookup(context.Background(), f)
			if !errors.Is(err, tc.err) || (tc.err == nil && d.Route.Name != tc.route) {
				t.Errorf("server %v: %s from %q: route %q, %v; want %q, %v", withServer, tc.user, tc.source, d.Route.Name, err, tc.route, tc.err)
			}
			if cerr := r.Check(f); !errors.Is(cerr, tc.err) {
				t.Errorf("server %v: Check %s from %q: %v, want %v", withServer, tc.user, tc.source, cerr, tc.err)
			}
			if withServer && tc.err == nil {
				<-asked // the route server gives the destinations of local routes too
			}
			select {
			case f := <-asked:
				t.Errorf("route server asked for a call the local routes refused: %+v", f)
			default:
			}
		}
		_, err = r.Lookup(context.Background(), Facts{User: "300", Source: "198.18.0.2:5060"})
		if withServer {
			if err != nil {
				t.Errorf("no local route, route server: %v", err)
			}
			if f := <-asked; f.User != "300" || f.Route != "route_server" {
				t.Errorf("route server got %+v", f)
			}
		} else if !errors.Is(err, ErrNoRoute) {
			t.Errorf("no route: %v, want ErrNoRoute", err)
		}
		if err := r.Check(Facts{User: "300", Source: "198.18.0.2:5060"}); err != nil {
			t.Errorf("Check of a user no route matches: %v, want nil (Lookup decides)", err)
		}
	}
}

// TestLookupAuthUsers: the first route that matches and takes the source
// decides whether the caller must authenticate: without a user it is
// ErrAuthRequired (later routes, even open ones, are not tried); with a
// user the route lists, the route; with another, the next routes (per
// user), and ErrForbidden when none lists it. The route server learns the
// user.
func TestLookupAuthUsers(t *testing.T) {
	c := parseConfig(t, `
[sip]
auth_file = "/etc/relayd/sip-users"
[[route]]
name = "lan"
match = "."
allow = ["198.18.0.0/24"]
destinations = ["sip:198.18.2.2"]
[[route]]
name = "alice"
match = "."
auth_users = ["alice"]
destinations = ["sip:198.18.3.2"]
[[route]]
name = "bob"
match = "^1"
auth_users = ["bob", "carol"]
destinations = ["sip:198.18.4.2"]
[[route]]
name = "open"
match = "."
destinations = ["sip:198.18.5.2"]
`)
	r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		user, source, authUser, route string
		err                           error
	}{
		{"100", "198.18.0.2:5060", "", "lan", nil},
		{"100", "203.0.113.1:5060", "", "", ErrAuthRequired},
		{"100", "203.0.113.1:5060", "alice", "alice", nil},
		{"100", "203.0.113.1:5060", "carol", "bob", nil},
		{"200", "203.0.113.1:5060", "carol", "open", nil},
		{"100", "203.0.113.1:5060", "dave", "open", nil},
	} {
		f := Facts{User: tc.user, Source: tc.source, AuthUser: tc.authUser}
		d, err := r.Lookup(context.Background(), f)
		if !errors.Is(err, tc.err) || (tc.err == nil && d.Route.Name != tc.route) {
			t.Errorf("%s from %s as %q: route %q, %v; want %q, %v", tc.user, tc.source, tc.authUser, d.Route.Name, err, tc.route, tc.err)
		}
		if cerr := r.Check(f); !errors.Is(cerr, tc.err) {
			t.Errorf("Check %s from %s as %q: %v, want %v", tc.user, tc.source, tc.authUser, cerr, tc.err)
		}
	}
	c = parseConfig(t, "[sip]\nauth_file = \"/x\"\n[[route]]\nname = \"a\"\nmatch = \".\"\nauth_users = [\"alice\"]\ndestinations = [\"sip:198.18.3.2\"]\n")
	r, _ = New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if _, err := r.Lookup(context.Background(), Facts{User: "1", AuthUser: "bob"}); !errors.Is(err, ErrForbidden) {
		t.Errorf("a user no route lists: %v, want ErrForbidden", err)
	}
}

// TestDecisionShared: calls routed by the table share its route (a held
// call's memory); a decision's copy changed after the lookup is not
// what it shares.
func TestDecisionShared(t *testing.T) {
	c := parseConfig(t, "[[route]]\nname = \"us\"\nmatch = \"^1\"\ndestinations = [\"sip:198.18.2.2\"]\nfailover_on = [503]\n")
	r, err := New(c.Routes, c.RouteServer, zaptest.NewLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	d1, err1 := r.Lookup(context.Background(), Facts{User: "123"})
	d2, err2 := r.Lookup(context.Background(), Facts{User: "1555"})
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if p1, p2 := d1.Shared(), d2.Shared(); p1 != p2 || p1.Name != "us" || !p1.Fails(503) {
		t.Errorf("two calls on route us share %p and %p (%+v)", p1, p2, p1)
	}
	var d Decision
	d.Route.Name = "mine"
	if p := d.Shared(); p.Name != "mine" || p == d1.Shared() {
		t.Errorf("a decision not from the table shares %+v", p)
	}
}
