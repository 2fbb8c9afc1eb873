package appliance

import "testing"

func TestCheckLog(t *testing.T) {
	log := []byte("== sip (10.0s)\nsip said this\n== calls_across_rollback (20.5s)\n" +
		"rollback: the action failed\ncall4: {\"calls\":2,\"succeeded\":2}\n== journal_err (80.1s)\nlater\n")
	for _, c := range []struct {
		name  string
		width int
		want  string
	}{
		{"calls_across_rollback", 30, "== calls_across_rollback (20.5 [...]\nrollback: the action failed\ncall4: {\"calls\":2,\"succeeded\": [...]\n"},
		{"calls_across", 100, ""}, // only a prefix of a check's name
		{"journal_err", 100, "== journal_err (80.1s)\nlater\n"},
		{"drain", 100, ""},
	} {
		if got := CheckLog(log, c.name, c.width); got != c.want {
			t.Errorf("CheckLog(%q, %d) = %q, want %q", c.name, c.width, got, c.want)
		}
	}
}
