//go:build !linux

package bench

import (
	"context"
	"errors"
)

func Kmod(context.Context, KmodConfig) (*KmodReport, error) {
	return nil, errors.New("kmodbench needs Linux (network namespaces, XDP, rtpengine's kernel module)")
}
