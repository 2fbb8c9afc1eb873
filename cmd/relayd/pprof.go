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
	"runtime"
	"runtime/debug"
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
	mux.HandleFunc("/debug/heapdump", heapDump)
	go http.Serve(l, mux)
}

// heapDump writes runtime/debug's heap dump, after a GC, to the file
// named by the query's path: every live object with its address and
// size, from which the lab tells how full the heap's spans are (what
// HeapInuse holds beyond HeapAlloc).
func heapDump(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	if path == "" {
		http.Error(w, "want ?path=FILE", http.StatusBadRequest)
		return
	}
	f, err := os.Create(path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	runtime.GC()
	debug.WriteHeapDump(f.Fd())
	if err := f.Close(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
