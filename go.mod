module github.com/relayd/relayd

go 1.26.8

require go.uber.org/zap v1.28.0

require (
	github.com/cilium/ebpf v0.22.0 // indirect
	go.uber.org/multierr v1.10.0 // indirect
	golang.org/x/sys v0.43.0 // indirect
)

tool github.com/cilium/ebpf/cmd/bpf2go
