package bench

import (
	"os"
	"testing"

	"github.com/relayd/relayd/lab/labrelay"
)

// TestMain removes the relayd binary labrelay.Build made for the lab tests.
func TestMain(m *testing.M) {
	code := m.Run()
	labrelay.RemoveBuild()
	os.Exit(code)
}
