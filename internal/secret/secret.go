// Package secret reads secrets (API tokens, credentials) from files that
// only their owner can read, and refuses files others could read or
// replace: a secret in a world-readable file is no secret, and one in a
// file another user may write is not the operator's.
package secret

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"syscall"
)

// MaxSize is the largest secret file read: tokens and credential lists
// are small, and a mistaken path (a log, a device) must not be slurped.
const MaxSize = 1 << 20

// ReadFile returns the contents of path, a regular file that neither its
// group nor others may read or write, owned by the user relayd runs as or
// by root. Symbolic links are followed (the check applies to the file
// they name).
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %#o: others may read or change it; make it readable by its owner only (chmod 600)", path, perm)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return nil, fmt.Errorf("%s is owned by uid %d: it must be root's or relayd's (uid %d)", path, st.Uid, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%s is larger than %d bytes: not a secret file", path, MaxSize)
	}
	return b, nil
}

// MinTokenLen is the shortest token accepted: 16 characters, 96 bits or
// more of a random base64 or hex string.
const MinTokenLen = 16

// ReadToken reads a bearer token: the file's first line, surrounding
// white space removed. It must be at least MinTokenLen printable ASCII
// characters with no spaces (what an Authorization header carries).
func ReadToken(path string) (string, error) {
	b, err := ReadFile(path)
	if err != nil {
		return "", err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	line = bytes.TrimSpace(line)
	if len(line) < MinTokenLen {
		return "", fmt.Errorf("%s: the token is %d characters, want at least %d (for example: head -c 32 /dev/urandom | base64)", path, len(line), MinTokenLen)
	}
	for _, c := range line {
		if c <= ' ' || c > '~' {
			return "", fmt.Errorf("%s: the token has a character that is not printable ASCII or is a space", path)
		}
	}
	return string(line), nil
}
