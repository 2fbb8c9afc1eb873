package srtpflow

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/binary"
	"reflect"
	"sync"
	"unsafe"
)

// ctrStream is the standard library's AES-CTR (cipher.NewCTR over
// crypto/aes), made once per context and moved to each packet's counter
// block before use. Its XORKeyStream encrypts eight counter blocks at a
// time with AES-NI, about 20 ns for a 160-byte payload against 150 ns for
// one cipher.Block Encrypt per 16 bytes (BenchmarkKeystream); but
// cipher.NewCTR takes the counter only when the stream is made, and a
// stream made per packet costs a 512-byte allocation (it holds a copy of
// the key schedule). So a context keeps one, and a packet writes its
// starting counter and keystream offset into it: three words of the
// standard library's aes.CTR, whose places ctrFields finds once with
// reflect and then checks against cipher.NewCTR's own output. Where the
// places are not found (another Go release changed the type) or the check
// fails, ctrFields says so and the contexts generate the keystream a block
// at a time, as before: nothing is ever written through a field that was
// not checked. Only the counter moves; the cipher, the mode and the key
// schedule are the standard library's.
type ctrStream struct {
	stream cipher.Stream
	obj    unsafe.Pointer // the aes.CTR the stream points to
	at     ctrLayout      // where its counter and offset are in it
}

// ctrLayout is where aes.CTR keeps its counter and offset, by byte offset
// in the struct: 16 bits each (the struct is 512 bytes), so that a
// context's stream fits in half a cache line beside the rest of what a
// packet reads (cmRTP).
type ctrLayout struct {
	lo, hi, off uint16
}

// ctrEnc is the offset of aes.CTR's round keys, 0 where they were not
// found: only the prefetch uses it (cmRTP.warmLines).
var ctrEnc uintptr

var (
	ctrOnce sync.Once
	ctrAt   ctrLayout
	ctrOK   bool
)

// ctrFields returns aes.CTR's layout, and whether a stream can be moved to
// a counter through it (see ctrStream).
func ctrFields() (ctrLayout, bool) {
	ctrOnce.Do(func() { ctrAt, ctrOK = findCTRLayout() })
	return ctrAt, ctrOK
}

// findCTRLayout finds the counter's and the offset's places in the CTR
// behind cipher.NewCTR's stream, then checks them: a stream moved to each
// of a few counters through them must give the keystream of a stream made
// at that counter, over several lengths.
func findCTRLayout() (ctrLayout, bool) {
	var key [16]byte
	for i := range key {
		key[i] = byte(i*7 + 1)
	}
	blk, err := aes.NewCipher(key[:])
	if err != nil {
		return ctrLayout{}, false
	}
	_, t, ok := ctrObject(cipher.NewCTR(blk, make([]byte, aes.BlockSize)))
	if !ok || t.PkgPath() != "crypto/internal/fips140/aes" || t.Name() != "CTR" {
		return ctrLayout{}, false
	}
	var l ctrLayout
	found := 0
	for i := range t.NumField() {
		f := t.Field(i)
		if f.Type.Kind() != reflect.Uint64 {
			continue
		}
		switch f.Name {
		case "ivlo":
			l.lo, found = uint16(f.Offset), found+1
		case "ivhi":
			l.hi, found = uint16(f.Offset), found+1
		case "offset":
			l.off, found = uint16(f.Offset), found+1
		}
	}
	if found != 3 || t.Size() > 1<<16 {
		return ctrLayout{}, false
	}
	// The round keys: the Block's enc, promoted from the block types it
	// embeds. Not checked like the counter (nothing is written there).
	if b := t.Field(0); b.Type.Kind() == reflect.Struct {
		if f, ok := b.Type.FieldByName("enc"); ok && f.Type.Kind() == reflect.Array {
			// A promoted field's Offset is within the struct that holds
			// it: add up the path's.
			off, st := b.Offset, b.Type
			for _, i := range f.Index {
				off += st.Field(i).Offset
				st = st.Field(i).Type
			}
			ctrEnc = off
		}
	}
	s, ok := newCTRStream(blk, l)
	if !ok {
		return ctrLayout{}, false
	}
	for _, iv := range [][2]uint64{{0, 0}, {0x0123456789abcdef, 0xfedcba9876540000}, {1, 0xffffffffffff0000}, {^uint64(0), ^uint64(0) - 2}} {
		var ivb [16]byte
		binary.BigEndian.PutUint64(ivb[:8], iv[0])
		binary.BigEndian.PutUint64(ivb[8:], iv[1])
		for _, n := range []int{0, 1, 15, 16, 17, 160, 1000} {
			want := make([]byte, n)
			cipher.NewCTR(blk, ivb[:]).XORKeyStream(want, want)
			got := make([]byte, n)
			s.xor(got, got, iv[0], iv[1])
			if !bytes.Equal(got, want) {
				return ctrLayout{}, false
			}
		}
	}
	return l, true
}

// ctrObject returns the object a stream of cipher.NewCTR points to and
// its type: the stream is a struct holding one pointer to it.
func ctrObject(s cipher.Stream) (unsafe.Pointer, reflect.Type, bool) {
	v := reflect.ValueOf(s)
	if v.Kind() != reflect.Struct || v.NumField() != 1 || v.Field(0).Kind() != reflect.Pointer || v.Field(0).IsNil() {
		return nil, nil, false
	}
	f := v.Field(0)
	t := f.Type().Elem()
	if t.Kind() != reflect.Struct {
		return nil, nil, false
	}
	return f.UnsafePointer(), t, true
}

// newCTRStream makes a stream under blk that packets move with layout l.
func newCTRStream(blk cipher.Block, l ctrLayout) (ctrStream, bool) {
	s := cipher.NewCTR(blk, make([]byte, aes.BlockSize))
	p, t, ok := ctrObject(s)
	if !ok || uintptr(l.lo)+8 > t.Size() || uintptr(l.hi)+8 > t.Size() || uintptr(l.off)+8 > t.Size() {
		return ctrStream{}, false
	}
	return ctrStream{stream: s, obj: p, at: l}, true
}

// counter returns the stream's counter fields and the bytes from the
// first of them to the end of the last.
func (s *ctrStream) counter() (unsafe.Pointer, uintptr) {
	lo := min(s.at.lo, s.at.hi, s.at.off)
	hi := max(s.at.lo, s.at.hi, s.at.off)
	return unsafe.Add(s.obj, lo), uintptr(hi-lo) + 8
}

// xor XORs the keystream from counter block hi||lo onto src into dst
// (which may be src).
func (s *ctrStream) xor(dst, src []byte, hi, lo uint64) {
	*(*uint64)(unsafe.Add(s.obj, s.at.hi)) = hi
	*(*uint64)(unsafe.Add(s.obj, s.at.lo)) = lo
	*(*uint64)(unsafe.Add(s.obj, s.at.off)) = 0
	s.stream.XORKeyStream(dst, src)
}
