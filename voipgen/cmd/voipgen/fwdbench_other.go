//go:build !linux

package main

import (
	"context"
	"errors"
	"io"
)

func fwdbench(context.Context, fwdConfig, io.Writer) (*fwdReport, error) {
	return nil, errors.New("fwdbench needs Linux (network namespaces, XDP)")
}
