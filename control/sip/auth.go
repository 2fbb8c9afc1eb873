package sip

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/binary"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/emiago/sipgo/sip"
	"github.com/icholy/digest"

	"github.com/relayd/relayd/config"
)

// Auth configures the digest authentication of calls through routes
// with auth_users.
type Auth struct {
	// Realm of the challenges; default "relayd".
	Realm string
	// Algorithms offered, most preferred first (RFC 8760): "SHA-256",
	// "MD5"; default both, in that order.
	Algorithms []string
	// Credentials are the users and their passwords; SetCredentials
	// replaces them.
	Credentials *config.Credentials
	// NonceLifetime is how long a nonce may be answered; default
	// nonceLifetime.
	NonceLifetime time.Duration
}

// nonceLifetime is long enough for a UA to answer a challenge, even
// after asking its user for the password; an expired nonce with the
// right password gets a new challenge (stale=true), which UAs answer
// without asking again.
const nonceLifetime = time.Minute

// maxUsedNonces bounds the nonces remembered as used: at most this many
// authenticated INVITEs per nonce lifetime. Beyond, a new authentication
// gets stale=true until older nonces expire: never a nonce accepted twice.
const maxUsedNonces = 1 << 16

// digestAuth checks SIP digest credentials (RFC 3261 22.2: relayd is the
// UAS, so 401 and WWW-Authenticate; RFC 2617 with qop=auth; SHA-256 of
// RFC 8760) and makes the challenges. Safe for concurrent use.
//
// A nonce is 16 bytes of issue time and randomness followed by an HMAC
// of them and of the caller's address, under a key random per process:
// relayd keeps no state for the nonces it hands out. It accepts a nonce
// once, within the lifetime, from the address it gave it to, for a
// digest uri naming the request's target. That is the replay protection:
// a captured INVITE replayed, from anywhere, or one whose Request-URI is
// rewritten, is challenged again, and a new challenge needs the password.
type digestAuth struct {
	realm      string
	algorithms []string
	lifetime   time.Duration
	now        func() time.Time
	key        [32]byte
	creds      atomic.Pointer[config.Credentials]

	mu   sync.Mutex           // guards used
	used map[string]time.Time // accepted nonces, until they expire
}

func newDigestAuth(a Auth) *digestAuth {
	d := &digestAuth{realm: a.Realm, algorithms: slices.Clone(a.Algorithms), lifetime: a.NonceLifetime, now: time.Now,
		used: make(map[string]time.Time)}
	if d.realm == "" {
		d.realm = "relayd"
	}
	if len(d.algorithms) == 0 {
		d.algorithms = slices.Clone(config.DefaultAuthAlgorithms)
	}
	if d.lifetime <= 0 {
		d.lifetime = nonceLifetime
	}
	rand.Read(d.key[:])
	d.creds.Store(a.Credentials)
	return d
}

// authState is what a request's credentials are worth.
type authState int

const (
	authNone   authState = iota // no credentials for relayd's realm
	authOK                      // the user is authenticated
	authStale                   // the right password, on a nonce expired, used or not relayd's: challenge again, stale=true
	authBad                     // an unknown user, a wrong password, or credentials of a kind relayd did not ask for
	authBadURI                  // the digest uri is not the request's target (RFC 2617 3.2.2.5: 400)
)

type authResult struct {
	state authState
	user  string // the username given; authenticated only with authOK
	why   string // for the log
}

// verify checks a request's Authorization for relayd's realm. It
// consumes the nonce of credentials it accepts.
func (d *digestAuth) verify(req *sip.Request, src netip.Addr) authResult {
	var cred *digest.Credentials
	for _, h := range req.GetHeaders("Authorization") {
		c, err := digest.ParseCredentials(h.Value())
		if err != nil {
			if digest.IsDigest(h.Value()) {
				return authResult{state: authBad, why: "malformed credentials"}
			}
			continue
		}
		if c.Realm == d.realm {
			cred = c
			break
		}
	}
	if cred == nil {
		return authResult{state: authNone}
	}
	res := authResult{state: authBad, user: cred.Username}
	if cred.Username == "" || cred.Nonce == "" || cred.URI == "" || cred.Response == "" {
		res.why = "malformed credentials"
		return res
	}
	alg := strings.ToUpper(cred.Algorithm)
	if alg == "" {
		alg = "MD5"
	}
	switch {
	case !slices.Contains(d.algorithms, alg):
		res.why = "algorithm " + cred.Algorithm + " not offered"
		return res
	case cred.Userhash:
		res.why = "userhash not offered"
		return res
	case cred.QOP != "" && cred.QOP != "auth":
		res.why = "qop " + cred.QOP + " not offered"
		return res
	case !sameTarget(cred.URI, &req.Recipient):
		return authResult{state: authBadURI, user: cred.Username, why: "digest uri " + cred.URI + " is not the Request-URI"}
	}
	pw, ok := d.creds.Load().Password(cred.Username)
	if !ok {
		res.why = "unknown user"
		return res
	}
	chal := &digest.Challenge{Realm: d.realm, Nonce: cred.Nonce, Algorithm: alg, Opaque: cred.Opaque}
	if cred.QOP != "" {
		chal.QOP = []string{cred.QOP}
	}
	want, err := digest.Digest(chal, digest.Options{Method: string(req.Method), URI: cred.URI, Username: cred.Username,
		Password: pw, Cnonce: cred.Cnonce, Count: cred.Nc})
	if err != nil || cred.Cnonce == "" && cred.QOP != "" ||
		subtle.ConstantTimeCompare([]byte(strings.ToLower(cred.Response)), []byte(want.Response)) != 1 {
		res.why = "wrong password"
		return res
	}
	if why := d.useNonce(cred.Nonce, src); why != "" {
		return authResult{state: authStale, user: cred.Username, why: why}
	}
	return authResult{state: authOK, user: cred.Username}
}

// sameTarget reports whether a digest uri names the request's target:
// the same user part, host and port (the scheme's default when absent).
// Routing looks at the user part: credentials computed for one number
// must not call another.
func sameTarget(digestURI string, target *sip.Uri) bool {
	var u sip.Uri
	if err := sip.ParseUri(digestURI, &u); err != nil {
		return false
	}
	port := func(u *sip.Uri) int {
		switch {
		case u.Port != 0:
			return u.Port
		case u.IsEncrypted():
			return 5061
		}
		return 5060
	}
	return u.User == target.User && strings.EqualFold(u.Host, target.Host) && port(&u) == port(target)
}

// nonce makes a nonce for a challenge to src.
func (d *digestAuth) nonce(src netip.Addr) string {
	var raw [32]byte
	binary.BigEndian.PutUint64(raw[:8], uint64(d.now().UnixNano()))
	rand.Read(raw[8:16])
	copy(raw[16:], d.mac(raw[:16], src))
	return base64.RawURLEncoding.EncodeToString(raw[:])
}

func (d *digestAuth) mac(head []byte, src netip.Addr) []byte {
	m := hmac.New(sha256.New, d.key[:])
	m.Write(head)
	a := src.Unmap().As16()
	m.Write(a[:])
	return m.Sum(nil)[:16]
}

// useNonce accepts a nonce once: it returns why it does not ("" when it
// does).
func (d *digestAuth) useNonce(n string, src netip.Addr) string {
	raw, err := base64.RawURLEncoding.DecodeString(n)
	if err != nil || len(raw) != 32 || !hmac.Equal(raw[16:], d.mac(raw[:16], src)) {
		return "nonce not given to this address by this run of relayd"
	}
	now := d.now()
	issued := time.Unix(0, int64(binary.BigEndian.Uint64(raw[:8])))
	expires := issued.Add(d.lifetime)
	if now.Before(issued) || !now.Before(expires) {
		return "nonce expired"
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.used[n]; ok {
		return "nonce already used"
	}
	if len(d.used) >= maxUsedNonces {
		for k, exp := range d.used {
			if !now.Before(exp) {
				delete(d.used, k)
			}
		}
		if len(d.used) >= maxUsedNonces {
			return "too many nonces in use"
		}
	}
	d.used[n] = expires
	return ""
}

// challenge returns the WWW-Authenticate headers of a 401 to src: one
// per algorithm, most preferred first (RFC 8760 2.4), on one new nonce.
func (d *digestAuth) challenge(src netip.Addr, stale bool) []sip.Header {
	n := d.nonce(src)
	out := make([]sip.Header, 0, len(d.algorithms))
	for _, alg := range d.algorithms {
		c := digest.Challenge{Realm: d.realm, Nonce: n, Algorithm: alg, QOP: []string{"auth"}, Stale: stale}
		out = append(out, sip.NewHeader("WWW-Authenticate", c.String()))
	}
	return out
}
