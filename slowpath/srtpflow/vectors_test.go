package srtpflow

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/relayd/relayd/sdes"
)

// The RFC vectors are reproduced through the package's public path: pion's
// Context only takes master keys, and RFC 3711 B.2 and RFC 7714 give session
// keys. So the test chains three checks:
//  1. a reference AES-CM / AES-GCM SRTP transform written here from the RFC
//     text reproduces the RFC vectors (B.2 keystreams, RFC 7714 packets);
//  2. the reference key derivation reproduces RFC 3711 B.3 and RFC 6188 7.2;
//  3. an Encrypter built from a master key produces exactly the bytes of
//     the reference transform run with the derived session keys (and the
//     Decrypter takes them back).

type hexString []byte

func (h *hexString) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	*h = v
	return err
}

type rfcVectors struct {
	AESCMKeystream []struct {
		Source        string
		SessionKey    hexString `json:"session_key"`
		IV, Keystream hexString
	} `json:"aes_cm_keystream"`
	KeyDerivation []struct {
		Source, Suite string
		MasterKey     hexString `json:"master_key"`
		MasterSalt    hexString `json:"master_salt"`
		CipherKey     hexString `json:"cipher_key"`
		CipherSalt    hexString `json:"cipher_salt"`
		AuthKey       hexString `json:"auth_key"`
	} `json:"key_derivation"`
	GCM []struct {
		Source, Suite          string
		SessionKey             hexString `json:"session_key"`
		SessionSalt            hexString `json:"session_salt"`
		RTP, SRTP, RTCP, SRTCP hexString
		RTCPIndex              uint32 `json:"rtcp_index"`
	}
}

func loadVectors(t *testing.T) rfcVectors {
	t.Helper()
	b, err := os.ReadFile("testdata/rfc_vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v rfcVectors
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}

func keystream(key, iv []byte, n int) []byte {
	blk, _ := aes.NewCipher(key)
	out := make([]byte, n)
	cipher.NewCTR(blk, iv).XORKeyStream(out, out)
	return out
}

// kdf is the RFC 3711 section 4.3 key derivation with key_derivation_rate 0:
// AES-CM keystream under the master key, IV = (label<<48 XOR salt) || 0x0000.
// A 96-bit (GCM) master salt is zero-padded to 112 bits (RFC 7714 section 11).
func kdf(label byte, masterKey, masterSalt []byte, n int) []byte {
	iv := make([]byte, 16)
	copy(iv, masterSalt)
	iv[7] ^= label
	return keystream(masterKey, iv, n)
}

type sessionKeys struct{ key, salt, auth []byte }

func derive(s sdes.Suite, mk, ms []byte, rtcp bool) sessionKeys {
	base := byte(0)
	if rtcp {
		base = 3
	}
	return sessionKeys{
		key:  kdf(base+0, mk, ms, s.KeyLen()),
		auth: kdf(base+1, mk, ms, 20),
		salt: kdf(base+2, mk, ms, s.SaltLen()),
	}
}

// refCM protects RTP (index = ROC<<16|SEQ) or RTCP (index = SRTCP index)
// with AES-CM and HMAC-SHA1, RFC 3711 sections 4.1.1 and 4.2.
func refCM(k sessionKeys, pkt []byte, roc uint32, rtcp bool, srtcpIndex uint32, tagLen int) []byte {
	hl := 12 + 4*int(pkt[0]&0x0f)
	index := uint64(roc)<<16 | uint64(binary.BigEndian.Uint16(pkt[2:]))
	if rtcp {
		hl, index = 8, uint64(srtcpIndex)
	}
	ssrc := pkt[4:8]
	if !rtcp {
		ssrc = pkt[8:12]
	}
	iv := make([]byte, 16)
	copy(iv, k.salt)
	for i := range 4 {
		iv[4+i] ^= ssrc[i]
	}
	var idx [8]byte
	binary.BigEndian.PutUint64(idx[:], index<<16)
	for i := range 8 {
		iv[8+i] ^= idx[i]
	}
	out := bytes.Clone(pkt)
	ks := keystream(k.key, iv, len(pkt)-hl)
	for i := range ks {
		out[hl+i] ^= ks[i]
	}
	mac := hmac.New(sha1.New, k.auth)
	if rtcp {
		out = binary.BigEndian.AppendUint32(out, 1<<31|srtcpIndex)
		mac.Write(out)
	} else {
		mac.Write(out)
		mac.Write(binary.BigEndian.AppendUint32(nil, roc))
	}
	return append(out, mac.Sum(nil)[:tagLen]...)
}

// refGCM protects RTP or RTCP with AES-GCM, RFC 7714 sections 8 and 9.
func refGCM(key, salt, pkt []byte, roc uint32, rtcp bool, srtcpIndex uint32) []byte {
	blk, _ := aes.NewCipher(key)
	g, _ := cipher.NewGCM(blk)
	iv := make([]byte, 12)
	if rtcp {
		copy(iv[2:], pkt[4:8])
		binary.BigEndian.PutUint32(iv[8:], srtcpIndex)
	} else {
		copy(iv[2:], pkt[8:12])
		binary.BigEndian.PutUint32(iv[6:], roc)
		copy(iv[10:], pkt[2:4])
	}
	for i := range iv {
		iv[i] ^= salt[i]
	}
	if rtcp {
		eIndex := binary.BigEndian.AppendUint32(nil, 1<<31|srtcpIndex)
		aad := append(bytes.Clone(pkt[:8]), eIndex...)
		out := g.Seal(bytes.Clone(pkt[:8]), iv, pkt[8:], aad)
		return append(out, eIndex...)
	}
	hl := 12 + 4*int(pkt[0]&0x0f)
	return g.Seal(bytes.Clone(pkt[:hl]), iv, pkt[hl:], pkt[:hl])
}

func TestRFC3711AESCMKeystream(t *testing.T) {
	for _, v := range loadVectors(t).AESCMKeystream {
		if got := keystream(v.SessionKey, v.IV, len(v.Keystream)); !bytes.Equal(got, v.Keystream) {
			t.Errorf("%s: keystream %x, want %x", v.Source, got, v.Keystream)
		}
	}
}

func TestRFC3711KeyDerivation(t *testing.T) {
	for _, v := range loadVectors(t).KeyDerivation {
		t.Run(v.Source, func(t *testing.T) {
			s, err := sdes.ParseSuite(v.Suite)
			if err != nil {
				t.Fatal(err)
			}
			k := derive(s, v.MasterKey, v.MasterSalt, false)
			if !bytes.Equal(k.key, v.CipherKey) || !bytes.Equal(k.salt, v.CipherSalt) || !bytes.Equal(k.auth, v.AuthKey) {
				t.Fatalf("reference derivation: key %x salt %x auth %x", k.key, k.salt, k.auth)
			}
			// Through pion: an SRTP packet and an SRTCP packet with these
			// master keys, a chosen SSRC, ROC and SRTCP index.
			cfg := Config{Suite: s, Key: v.MasterKey, Salt: v.MasterSalt}
			e, err := NewEncrypter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			const roc, seq, ssrc = 7, 0x1234, 0xdeadbeef
			pkt := rtpPacket(seq, ssrc)
			e.t.setROC(ssrc, roc)
			got, err := e.EncryptRTP(make([]byte, 0, 256), pkt)
			if err != nil {
				t.Fatal(err)
			}
			want := refCM(k, pkt, roc, false, 0, s.RTPTagLen())
			if !bytes.Equal(got, want) {
				t.Fatalf("SRTP:\ngot  %x\nwant %x", got, want)
			}
			rk := derive(s, v.MasterKey, v.MasterSalt, true)
			rpkt := rtcpPacket(ssrc)
			e.t.ctx.SetIndex(ssrc, 99)
			gotR, err := e.EncryptRTCP(make([]byte, 0, 128), rpkt)
			if err != nil {
				t.Fatal(err)
			}
			if wantR := refCM(rk, rpkt, 0, true, 100, s.RTCPTagLen()); !bytes.Equal(gotR, wantR) {
				t.Fatalf("SRTCP:\ngot  %x\nwant %x", gotR, wantR)
			}
			d, _ := NewDecrypter(cfg)
			d.t.setROC(ssrc, roc)
			if p, err := d.DecryptRTP(make([]byte, 0, 256), want); err != nil || !bytes.Equal(p, pkt) {
				t.Fatalf("decrypt reference SRTP: %v", err)
			}
		})
	}
}

func TestRFC7714GCM(t *testing.T) {
	for _, v := range loadVectors(t).GCM {
		t.Run(v.Source, func(t *testing.T) {
			s, err := sdes.ParseSuite(v.Suite)
			if err != nil {
				t.Fatal(err)
			}
			// 1. The reference reproduces the RFC packets (ROC 0).
			if got := refGCM(v.SessionKey, v.SessionSalt, v.RTP, 0, false, 0); !bytes.Equal(got, v.SRTP) {
				t.Fatalf("reference SRTP:\ngot  %x\nwant %x", got, v.SRTP)
			}
			if got := refGCM(v.SessionKey, v.SessionSalt, v.RTCP, 0, true, v.RTCPIndex); !bytes.Equal(got, v.SRTCP) {
				t.Fatalf("reference SRTCP:\ngot  %x\nwant %x", got, v.SRTCP)
			}
			// 2. pion, from a master key (the RFC's session key and salt
			// reused as master key and salt), matches the reference with
			// the derived session keys, on the RFC's packets.
			cfg := Config{Suite: s, Key: v.SessionKey, Salt: v.SessionSalt}
			k := derive(s, cfg.Key, cfg.Salt, false)
			rk := derive(s, cfg.Key, cfg.Salt, true)
			e, err := NewEncrypter(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.EncryptRTP(make([]byte, 0, 256), v.RTP)
			if err != nil {
				t.Fatal(err)
			}
			want := refGCM(k.key, k.salt, v.RTP, 0, false, 0)
			if !bytes.Equal(got, want) {
				t.Fatalf("SRTP:\ngot  %x\nwant %x", got, want)
			}
			rssrc := binary.BigEndian.Uint32(v.RTCP[4:])
			e.t.ctx.SetIndex(rssrc, v.RTCPIndex-1) // pion increments before use
			gotR, err := e.EncryptRTCP(make([]byte, 0, 256), v.RTCP)
			if err != nil {
				t.Fatal(err)
			}
			wantR := refGCM(rk.key, rk.salt, v.RTCP, 0, true, v.RTCPIndex)
			if !bytes.Equal(gotR, wantR) {
				t.Fatalf("SRTCP:\ngot  %x\nwant %x", gotR, wantR)
			}
			d, _ := NewDecrypter(cfg)
			if p, err := d.DecryptRTP(make([]byte, 0, 256), want); err != nil || !bytes.Equal(p, v.RTP) {
				t.Fatalf("decrypt reference SRTP: %v", err)
			}
			if p, err := d.DecryptRTCP(make([]byte, 0, 256), wantR); err != nil || !bytes.Equal(p, v.RTCP) {
				t.Fatalf("decrypt reference SRTCP: %v", err)
			}
		})
	}
}
