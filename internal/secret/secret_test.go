package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func write(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil { // umask
		t.Fatal(err)
	}
	return p
}

func TestReadToken(t *testing.T) {
	for _, tc := range []struct {
		name, content string
		mode          os.FileMode
		want, err     string
	}{
		{"ok", "s3cr3t-0123456789abcdef\n", 0o600, "s3cr3t-0123456789abcdef", ""},
		{"ok read-only, spaces around", "  0123456789abcdef  \nignored\n", 0o400, "0123456789abcdef", ""},
		{"group readable", "0123456789abcdef\n", 0o640, "", "mode 0640"},
		{"world readable", "0123456789abcdef\n", 0o604, "", "mode 0604"},
		{"group writable", "0123456789abcdef\n", 0o620, "", "mode 0620"},
		{"short", "0123456789\n", 0o600, "", "10 characters, want at least 16"},
		{"empty", "", 0o600, "", "0 characters"},
		{"space inside", "0123456789 abcdef\n", 0o600, "", "not printable ASCII or is a space"},
		{"non-ASCII", "0123456789abcdéf\n", 0o600, "", "not printable ASCII"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadToken(write(t, tc.content, tc.mode))
			if tc.err == "" {
				if err != nil || got != tc.want {
					t.Fatalf("ReadToken = %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("ReadToken = %q, %v; want an error with %q", got, err, tc.err)
			}
		})
	}
}

func TestReadFileRefuses(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadFile(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("a missing file: %v, want not-exist", err)
	}
	big := write(t, strings.Repeat("x", MaxSize+1), 0o600)
	if _, err := ReadFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("a large file: %v", err)
	}
	if os.Geteuid() == 0 {
		p := write(t, "0123456789abcdef", 0o600)
		if err := os.Chown(p, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadFile(p); err == nil || !strings.Contains(err.Error(), "owned by uid 4242") {
			t.Errorf("another user's file: %v", err)
		}
	}
}
