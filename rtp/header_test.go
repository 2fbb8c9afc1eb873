package rtp

import (
	"bytes"
	"encoding/hex"
	"testing"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHeaderUnmarshal(t *testing.T) {
	// V=2 P=1 X=1 CC=2, M=1 PT=0, seq 0x1234, ts 0xdeadbeef, ssrc 0x01020304,
	// CSRCs 0x0a0b0c0d 0x11121314, extension 0xBEDE with 1 word, payload
	// 0xaa 0xbb, 2 bytes padding.
	b := mustHex(t, "b2"+"80"+"1234"+"deadbeef"+"01020304"+
		"0a0b0c0d"+"11121314"+"bede0001"+"10ff0000"+"aabb"+"0002")
	var h Header
	off, err := h.Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if off != 12+8+8 {
		t.Fatalf("payload offset %d, want 28", off)
	}
	if !h.Padding || !h.Extension || !h.Marker || h.PayloadType != 0 || h.SequenceNumber != 0x1234 ||
		h.Timestamp != 0xdeadbeef || h.SSRC != 0x01020304 || h.CSRCCount != 2 ||
		h.CSRC[0] != 0x0a0b0c0d || h.CSRC[1] != 0x11121314 || h.ExtensionProfile != 0xBEDE ||
		!bytes.Equal(h.ExtensionPayload, mustHex(t, "10ff0000")) || h.PaddingLen != 2 {
		t.Fatalf("parsed %+v", h)
	}
	if p := b[off : len(b)-int(h.PaddingLen)]; !bytes.Equal(p, []byte{0xaa, 0xbb}) {
		t.Fatalf("payload %x", p)
	}
	got, err := h.Append(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b[:off]) {
		t.Fatalf("re-marshalled\n got %x\nwant %x", got, b[:off])
	}

	// Reuse: a plain header must clear the previous extension and padding.
	plain := mustHex(t, "8008000100000a0000000007"+"ff")
	off, err = h.Unmarshal(plain)
	if err != nil || off != 12 || h.Extension || h.ExtensionPayload != nil || h.PaddingLen != 0 ||
		h.CSRCCount != 0 || h.PayloadType != 8 || h.Marker {
		t.Fatalf("reuse: off %d err %v %+v", off, err, h)
	}
}

func TestHeaderUnmarshalErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		hex  string
		want error
	}{
		{"empty", "", ErrShortPacket},
		{"11 bytes", "8000000100000000000000", ErrShortPacket},
		{"version 1", "400000010000000000000000", ErrBadVersion},
		{"version 0 (STUN)", "000100000000000000000000", ErrBadVersion},
		{"CSRC beyond end", "81000001000000000000000000", ErrShortPacket},
		{"extension header missing", "900000010000000000000000", ErrShortExtension},
		{"extension body beyond end", "900000010000000000000000bede0002aaaaaaaa", ErrShortExtension},
		{"padding count zero", "a0000001000000000000000000", ErrBadPadding},
		{"padding beyond payload", "a0000001000000000000000005", ErrBadPadding},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Header
			if _, err := h.Unmarshal(mustHex(t, tc.hex)); err != tc.want {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestHeaderMarshalErrors(t *testing.T) {
	h := Header{Extension: true, ExtensionPayload: []byte{1, 2, 3}}
	if _, err := h.MarshalTo(make([]byte, 64)); err != ErrExtensionLength {
		t.Fatalf("err = %v, want ErrExtensionLength", err)
	}
	h = Header{CSRCCount: 16}
	if _, err := h.MarshalTo(make([]byte, 128)); err != ErrTooManyCSRC {
		t.Fatalf("err = %v, want ErrTooManyCSRC", err)
	}
	h = Header{}
	if _, err := h.MarshalTo(make([]byte, 11)); err != ErrShortBuffer {
		t.Fatalf("err = %v, want ErrShortBuffer", err)
	}
}

func TestHeaderNoAlloc(t *testing.T) {
	b := mustHex(t, "b2801234deadbeef010203040a0b0c0d11121314bede000110ff0000aabb0002")
	buf := make([]byte, 64)
	var h Header
	if n := testing.AllocsPerRun(100, func() {
		if _, err := h.Unmarshal(b); err != nil {
			t.Fatal(err)
		}
		if _, err := h.MarshalTo(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := h.Append(buf[:0]); err != nil {
			t.Fatal(err)
		}
		var bad Header
		_, _ = bad.Unmarshal(b[:5])
	}); n != 0 {
		t.Fatalf("allocs = %v", n)
	}
}

func TestRTCP(t *testing.T) {
	// Compound: SR with one report block, then an empty RR.
	sr := mustHex(t, "81c8000c"+"11223344"+
		"e1234567"+"89abcdef"+"00001000"+"00000010"+"00000a00"+ // sender info
		"55667788"+"80fffffe"+"0001fff0"+"00000020"+"12345678"+"00010000") // block
	rr := mustHex(t, "80c90001"+"99999999")
	b := append(append([]byte{}, sr...), rr...)

	var h RTCPHeader
	off, err := h.Unmarshal(b)
	if err != nil || off != 8 || h.Type != TypeSenderReport || h.Count != 1 || h.SSRC != 0x11223344 || h.PacketLen() != 52 {
		t.Fatalf("SR header: off %d err %v %+v", off, err, h)
	}
	var si SenderInfo
	if err := si.Unmarshal(b[off:]); err != nil || si.NTPTime != 0xe123456789abcdef || si.RTPTime != 0x1000 ||
		si.PacketCount != 16 || si.OctetCount != 2560 {
		t.Fatalf("sender info %+v err %v", si, err)
	}
	var rb ReceptionReport
	if err := rb.Unmarshal(b[off+SenderInfoSize:]); err != nil {
		t.Fatal(err)
	}
	want := ReceptionReport{SSRC: 0x55667788, FractionLost: 0x80, TotalLost: -2, HighestSeq: 0x1fff0,
		Jitter: 32, LSR: 0x12345678, DLSR: 0x10000}
	if rb != want {
		t.Fatalf("report block %+v, want %+v", rb, want)
	}
	buf := make([]byte, 52)
	h.MarshalTo(buf)
	si.MarshalTo(buf[8:])
	rb.MarshalTo(buf[28:])
	if !bytes.Equal(buf, sr) {
		t.Fatalf("re-marshalled\n got %x\nwant %x", buf, sr)
	}

	next := b[h.PacketLen():]
	if _, err := h.Unmarshal(next); err != nil || h.Type != TypeReceiverReport || h.Count != 0 || h.PacketLen() != 8 {
		t.Fatalf("RR: err %v %+v", err, h)
	}

	for _, tc := range []struct {
		hex  string
		want error
	}{
		{"80c90001", ErrShortPacket},
		{"40c9000100000000", ErrBadVersion},
		{"80c9000200000000", ErrBadLength}, // claims 12 bytes
		{"80c9000000000000", ErrBadLength}, // 4 bytes: no room for SSRC
		{"a0c9000200000000000000ff", ErrBadPadding},
	} {
		if _, err := h.Unmarshal(mustHex(t, tc.hex)); err != tc.want {
			t.Errorf("%s: err = %v, want %v", tc.hex, err, tc.want)
		}
	}

	// TotalLost clamps to 24 bits.
	big := ReceptionReport{TotalLost: 1 << 30}
	big.MarshalTo(buf)
	if err := rb.Unmarshal(buf); err != nil || rb.TotalLost != 0x7fffff {
		t.Fatalf("clamped TotalLost = %d", rb.TotalLost)
	}
}

func TestDemux(t *testing.T) {
	for _, tc := range []struct {
		b    []byte
		want Class
	}{
		{nil, ClassUnknown},
		{[]byte{0}, ClassSTUN},
		{[]byte{3, 0}, ClassSTUN},
		{[]byte{4}, ClassUnknown},
		{[]byte{16}, ClassZRTP},
		{[]byte{19}, ClassZRTP},
		{[]byte{20}, ClassDTLS},
		{[]byte{22, 0xfe}, ClassDTLS},
		{[]byte{63}, ClassDTLS},
		{[]byte{64}, ClassTURN},
		{[]byte{79}, ClassTURN},
		{[]byte{80}, ClassUnknown},
		{[]byte{127, 0}, ClassUnknown},
		{[]byte{128}, ClassUnknown}, // RTP range but no second byte
		{[]byte{128, 0}, ClassRTP},
		{[]byte{0x80, 0x80}, ClassRTP}, // PCMU with marker
		{[]byte{0x80, 191}, ClassRTP},  // PT 63 with marker
		{[]byte{0x80, 192}, ClassRTCP}, // first RTCP type (FIR)
		{[]byte{0x81, 200}, ClassRTCP}, // SR
		{[]byte{0x80, 223}, ClassRTCP}, // last of the range
		{[]byte{0x80, 224}, ClassRTP},  // PT 96 with marker
		{[]byte{0x80, 96}, ClassRTP},   // dynamic PT
		{[]byte{191, 201}, ClassRTCP},
		{[]byte{192, 201}, ClassUnknown}, // version 3
		{[]byte{255}, ClassUnknown},
	} {
		if got := Demux(tc.b); got != tc.want {
			t.Errorf("Demux(%x) = %v, want %v", tc.b, got, tc.want)
		}
	}
}
