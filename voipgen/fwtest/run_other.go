//go:build !linux

package fwtest

import (
	"context"
	"errors"
)

// Run needs Linux (network namespaces, keepalived, conntrackd).
func Run(context.Context, Config) (*Report, error) {
	return nil, errors.New("fwtest runs on Linux only (network namespaces)")
}
