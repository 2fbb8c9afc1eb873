package bench

import (
	"os"
	"testing"

	"github.com/relayd/relayd/lab/labrelay"
)

// TestMain removes the relayd and voipgen binaries built for the lab tests.
func TestMain(m *testing.M) {
	code := m.Run()
	labrelay.RemoveBuild()
	removeVoipgenBuild()
	os.Exit(code)
}
