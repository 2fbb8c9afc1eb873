package config

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"strings"
	"unicode"

	"github.com/relayd/relayd/internal/secret"
)

// Credentials are the digest users of [sip] auth_file and their
// passwords. Its String and GoString name only how many there are, so
// that printing a config shows no password. Read-only once loaded; the
// nil value has no user.
type Credentials struct {
	pw map[string]string
}

// NewCredentials returns credentials holding users (name to password).
func NewCredentials(users map[string]string) *Credentials {
	return &Credentials{pw: maps.Clone(users)}
}

// Password returns user's password.
func (c *Credentials) Password(user string) (string, bool) {
	if c == nil {
		return "", false
	}
	p, ok := c.pw[user]
	return p, ok
}

// Len returns the number of users.
func (c *Credentials) Len() int {
	if c == nil {
		return 0
	}
	return len(c.pw)
}

// Equal reports whether c and o hold the same users and passwords.
func (c *Credentials) Equal(o *Credentials) bool {
	if c == nil || o == nil {
		return c.Len() == 0 && o.Len() == 0
	}
	return maps.Equal(c.pw, o.pw)
}

func (c *Credentials) String() string   { return fmt.Sprintf("%d users", c.Len()) }
func (c *Credentials) GoString() string { return "config.Credentials{" + c.String() + "}" }

// readCredentials reads an auth_file: "user:password" lines; blank lines
// and lines starting with "#" are skipped. Messages name lines, never
// passwords.
func readCredentials(path string) (*Credentials, error) {
	b, err := secret.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pw := make(map[string]string)
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	var errs []error
	for sc.Scan() {
		n++
		line := strings.TrimRight(sc.Text(), "\r")
		if t := strings.TrimSpace(line); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		user, pass, ok := strings.Cut(line, ":")
		user = strings.TrimSpace(user)
		switch {
		case !ok || pass == "":
			errs = append(errs, fmt.Errorf("%s: line %d: want user:password", path, n))
		case user == "" || strings.ContainsFunc(user, func(c rune) bool { return c == '"' || c == '\\' || unicode.IsSpace(c) || unicode.IsControl(c) }):
			errs = append(errs, fmt.Errorf("%s: line %d: %q is not a user name (no quote, backslash or space)", path, n, user))
		case pw[user] != "":
			errs = append(errs, fmt.Errorf("%s: line %d: user %q defined twice", path, n, user))
		default:
			pw[user] = pass
		}
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", path, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &Credentials{pw: pw}, nil
}

// loadFiles reads the files the config names whose contents relayd
// needs at start: the auth_file's credentials, the TLS certificate and
// key, the TLS CAs. It checks what Parse cannot: that the files holding
// secrets are private, the routes' users in the auth_file, the key the
// certificate's.
func (c *Config) loadFiles(lines map[string]int) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Line: lines[key], Msg: fmt.Sprintf(format, args...)})
	}
	s := &c.SIP
	if s.AuthFile != "" {
		creds, err := readCredentials(s.AuthFile)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission) {
				err = fmt.Errorf("cannot read it: %w", err)
			}
			bad("sip.auth_file", "%v", err)
		} else {
			s.Credentials = creds
			for i, r := range c.Routes {
				for _, u := range r.AuthUsers {
					if _, ok := creds.Password(u); !ok {
						bad(fmt.Sprintf("route[%d].auth_users", i), "user %q is not in %s", u, s.AuthFile)
					}
				}
			}
		}
	}
	if s.TLSCert != "" && s.TLSKey != "" {
		cert, err := loadKeyPair(s.TLSCert, s.TLSKey)
		if err != nil {
			bad("sip.tls_key", "%v", err)
		} else {
			s.TLSCertificate = cert
		}
	}
	if s.TLSCA != "" {
		pool := x509.NewCertPool()
		pem, err := os.ReadFile(s.TLSCA)
		switch {
		case err != nil:
			bad("sip.tls_ca", "cannot read it: %v", err)
		case !pool.AppendCertsFromPEM(pem):
			bad("sip.tls_ca", "%s holds no PEM certificate", s.TLSCA)
		default:
			s.TLSRoots = pool
		}
	}
	return errors.Join(errs...)
}

// loadKeyPair reads a certificate and its private key, which must be in
// a private file.
func loadKeyPair(certFile, keyFile string) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("tls_cert: cannot read it: %w", err)
	}
	keyPEM, err := secret.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", certFile, keyFile, err)
	}
	return &cert, nil
}
