//go:build relaydpprof

// This file is in test builds only (go build -tags relaydpprof, as the
// lab's benchmarks build relayd): a relayd that serves net/http/pprof on
// the unix socket named by RELAYD_PPROF, for CPU and heap profiles of a
// running daemon. Release builds have no profiling endpoint.

package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
)

func init() {
	path := os.Getenv("RELAYD_PPROF")
	if path == "" {
		return
	}
	os.Remove(path) // a socket left by a killed run
	l, err := net.Listen("unix", path)
	if err != nil {
		fmt.Fprintf(os.Stderr, "relayd: pprof listen %s: %v\n", path, err)
		return
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	go http.Serve(l, mux)
}
