//go:build !linux

package hostprep

import (
	"errors"

	"go.uber.org/zap"
)

// Prepare is not supported outside Linux.
func Prepare(cfg Config, log *zap.Logger) error {
	return errors.New("relayd -prepare needs Linux")
}
