package lab

import (
	"os"
	"testing"
	"time"
)

// TestHold keeps a lab up for manual inspection: LAB_HOLD=60s go test -run TestHold ./lab/
func TestHold(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("LAB_HOLD"))
	if err != nil {
		t.Skip("LAB_HOLD not set")
	}
	l := NewConfigT(t, Config{Prefix: "rlhold-"})
	t.Logf("lab %s up for %v", l.Prefix(), d)
	time.Sleep(d)
}
