//go:build !linux

package bench

import (
	"context"
	"errors"
	"io"
)

func Fwd(context.Context, FwdConfig, io.Writer) (*FwdReport, error) {
	return nil, errors.New("fwdbench needs Linux (network namespaces, XDP)")
}
