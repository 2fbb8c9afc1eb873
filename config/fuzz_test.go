package config

import (
	"errors"
	"testing"
)

// FuzzParse checks that Parse never panics and that it returns either a
// config or an error made of *Error values. Seeds are in testdata/fuzz.
func FuzzParse(f *testing.F) {
	f.Add([]byte(minimal))
	f.Add([]byte("[log]\nlevel = \"debug\"\n[media]\naddress6 = \"2001:2::1\"\nports=\"2000-2001\"\n"))
	f.Add([]byte("a.b.c = [1, {x = 2}]\n[[t]]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse(data)
		if (c == nil) == (err == nil) {
			t.Fatalf("Parse returned config %v and error %v", c, err)
		}
		if err != nil {
			var ce *Error
			if !errors.As(err, &ce) {
				t.Fatalf("error %v (%T) is not a *config.Error", err, err)
			}
			return
		}
		if c.Media.PortMin >= c.Media.PortMax || c.Media.TimeoutDuration <= 0 {
			t.Fatalf("valid config with bad media: %+v", c.Media)
		}
	})
}
