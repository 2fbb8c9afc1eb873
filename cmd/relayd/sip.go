package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	sipgo "github.com/emiago/sipgo/sip"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/relayd/relayd/config"
	"github.com/relayd/relayd/control/admin"
	"github.com/relayd/relayd/control/call"
	"github.com/relayd/relayd/control/cdr"
	"github.com/relayd/relayd/control/ng"
	"github.com/relayd/relayd/control/route"
	"github.com/relayd/relayd/control/sip"
	"github.com/relayd/relayd/control/state"
)

// b2bua is the SIP B2BUA with its call table and CDR writer; the zero
// value (no [sip] listen addresses) does nothing.
type b2bua struct {
	calls   *call.Table
	srv     *sip.Server
	cdrs    *cdr.Writer
	store   *state.Store // nil without [state] path
	cancel  context.CancelFunc
	done    chan struct{} // closed when Serve returned
	err     error         // what Serve returned, once done is closed
	metrics []prometheus.Collector
	router  *route.Router
}

// startB2BUA starts the B2BUA when the config has SIP listeners. With a
// [state] path it takes back the calls the previous run kept, and their
// flows from the flow manager's call flows of a previous run.
func startB2BUA(ctx context.Context, cfg *config.Config, log *zap.Logger, calls *call.Table) (*b2bua, error) {
	b := &b2bua{calls: calls}
	if !cfg.SIP.Enabled() && !cfg.NG.Enabled() {
		return b, nil
	}
	var err error
	b.cdrs, err = cdr.New(cdr.Config{
		Path: cfg.CDR.Path, PostURL: cfg.CDR.PostURL, MaxSize: cfg.CDR.MaxSize, Keep: cfg.CDR.Keep,
		FsyncInterval: cfg.CDR.FsyncDuration, QueueSize: cfg.CDR.QueueSize,
	}, log.Named("cdr"))
	if err != nil {
		return nil, err
	}
	var store sip.Store
	if cfg.State.Path != "" {
		b.store, err = state.Open(state.Config{Path: cfg.State.Path, Version: getVersion()}, log.Named("state"))
		if err != nil {
			b.cdrs.Close(ctx)
			return nil, err
		}
		store = b.store
		b.metrics = append(b.metrics, b.store.Metrics())
	} else {
		log.Warn("no [state] path: a restart of relayd hangs up every call")
	}
	if !cfg.SIP.Enabled() {
		return b, nil
	}
	router, err := route.New(cfg.Routes, cfg.RouteServer, log.Named("route"))
	if err != nil {
		b.cdrs.Close(ctx)
		if b.store != nil {
			b.store.Close()
		}
		return nil, err
	}
	b.router = router
	setWaitTimer(cfg.SIP.WaitDuration)
	var serverTLS *tls.Config
	if c := cfg.SIP.TLSCertificate; c != nil {
		serverTLS = &tls.Config{Certificates: []tls.Certificate{*c}}
	}
	b.srv, err = sip.New(sip.Config{
		Listeners:    cfg.SIP.Listeners,
		Router:       router,
		Calls:        b.calls,
		MediaTimeout: cfg.Media.TimeoutDuration,
		MaxDuration:  cfg.SIP.MaxDuration,
		RateLimit:    cfg.SIP.RateLimit,
		RateBurst:    cfg.SIP.RateBurstParsed,
		MaxCalls:     cfg.SIP.MaxCalls,
		RetryAfter:   cfg.SIP.RetryAfterDur,
		OnEnd:        b.cdrs.Write,
		UserAgent:    "relayd/" + getVersion(),
		Store:        store,
		Auth:         sip.Auth{Realm: cfg.SIP.AuthRealm, Algorithms: cfg.SIP.AuthAlgorithms, Credentials: cfg.SIP.Credentials},
		TLS:          serverTLS,
		TLSClient:    &tls.Config{RootCAs: cfg.SIP.TLSRoots}, // nil roots: the system's
	}, log.Named("sip"))
	if err != nil {
		b.cdrs.Close(ctx)
		if b.store != nil {
			b.store.Close()
		}
		return nil, err
	}
	b.metrics = append(b.metrics, b.srv.Metrics())
	// Bind before reporting ready: a listener that cannot bind fails the
	// start with its address.
	if err := b.srv.Listen(); err != nil {
		b.cdrs.Close(ctx)
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	b.cancel = cancel
	b.done = make(chan struct{})
	go func() {
		b.err = b.srv.Serve(sctx)
		close(b.done)
	}()
	return b, nil
}

// Done is closed if the B2BUA's listeners stop (nil when off: never);
// Error then says why.
func (b *b2bua) Done() <-chan struct{} { return b.done }

// Error returns why the listeners stopped, once Done is closed.
func (b *b2bua) Error() error { return b.err }

// stop stops the B2BUA: with a store, answered calls are kept for the
// next run (persisted, flows in place, no BYE); without one they are hung
// up. Calls being set up get 503 and a CDR either way. Shutdown runs while
// the listeners are open (its final responses, CANCELs and BYEs need
// them); then the listeners stop, the CDRs are flushed and the store
// closed.
func (b *b2bua) stop(ctx context.Context) error {
	var errs []error
	if b.srv != nil {
		errs = append(errs, b.srv.Shutdown(ctx))
		b.cancel()
		select {
		case <-b.done:
			errs = append(errs, b.err)
		case <-ctx.Done():
			errs = append(errs, fmt.Errorf("sip stop: %w", ctx.Err()))
		}
	}
	if b.cdrs != nil {
		errs = append(errs, b.cdrs.Close(ctx))
	}
	if b.store != nil {
		errs = append(errs, b.store.Close())
	}
	return errors.Join(errs...)
}

// control returns what the admin API hangs up and drains calls with; nil
// (501 from the API) without the B2BUA.
func (b *b2bua) control() admin.CallControl {
	if b.srv == nil {
		return nil
	}
	return b.srv
}

var _ admin.CallControl = (*sip.Server)(nil)

// cdrStats returns the CDR writer's counters for /metrics; nil without
// the B2BUA.
func (b *b2bua) cdrStats() func() cdr.Stats {
	if b.cdrs == nil {
		return nil
	}
	return b.cdrs.Stats
}

// ngStore returns the store for the ng engine's calls; nil without
// [state] path.
func (b *b2bua) ngStore() ng.Store {
	if b.store == nil {
		return nil
	}
	return b.store
}

// setWaitTimer applies sip.wait_timer: sipgo's Timers D and J, package
// variables its transactions read as they start. Written only when it
// changes them (relayd has one B2BUA, set before it serves).
func setWaitTimer(d time.Duration) {
	if d > 0 && (sipgo.Timer_D != d || sipgo.Timer_J != d) {
		sipgo.Timer_D, sipgo.Timer_J = d, d
	}
}
