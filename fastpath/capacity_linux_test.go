package fastpath

import (
	"testing"

	"github.com/relayd/relayd/dataplane"
)

func TestCapacity(t *testing.T) {
	e := newTestEnv(t)
	_, max := e.fp.Capacity()
	if max != e.fp.cfg.MaxFlows || max == 0 {
		t.Errorf("max %d, want max_flows %d", max, e.fp.cfg.MaxFlows)
	}
	a := dataplane.Flow{ID: 7, Match: ap(relay4, 30000), SendFrom: ap(relay4, 30002), SendTo: ap(callee4, 5000)}
	b := dataplane.Flow{ID: 8, Match: ap(relay4, 30004), SendFrom: ap(relay4, 30006), SendTo: ap(callee4, 5004)}
	for _, fl := range []dataplane.Flow{a, b} {
		if err := e.fp.Install(fl); err != nil {
			t.Fatal(err)
		}
	}
	if used, _ := e.fp.Capacity(); used != 2 {
		t.Errorf("%d used after 2 installs", used)
	}
	if _, err := e.fp.Remove(a.Match); err != nil {
		t.Fatal(err)
	}
	if used, _ := e.fp.Capacity(); used != 1 {
		t.Errorf("%d used after a remove, want 1", used)
	}
}
