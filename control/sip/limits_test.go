package sip

import (
	"testing"
	"time"
)

// TestBranchSet: a branch relayd sent is known for at least branchTTL and
// at most twice that; other branches are not.
func TestBranchSet(t *testing.T) {
	b := newBranchSet()
	b.add("z9hG4bK-relayd-1")
	if !b.has("z9hG4bK-relayd-1") {
		t.Fatal("a branch just added is not known")
	}
	for _, other := range []string{"z9hG4bK-relayd-2", "z9hG4bK-relayd-", "", "Z9HG4BK-RELAYD-1"} {
		if b.has(other) {
			t.Errorf("branch %q was never added but is known", other)
		}
	}
	// One rotation: still known (the previous generation).
	b.at = b.at.Add(-branchTTL - time.Second)
	b.add("z9hG4bK-relayd-3")
	if !b.has("z9hG4bK-relayd-1") || !b.has("z9hG4bK-relayd-3") {
		t.Fatal("a branch of the previous generation or the new one is not known")
	}
	// Two: gone.
	b.at = b.at.Add(-branchTTL - time.Second)
	if b.has("z9hG4bK-relayd-1") {
		t.Error("a branch two generations old is still known")
	}
	if !b.has("z9hG4bK-relayd-3") {
		t.Error("a branch of the previous generation is not known")
	}
}
