//go:build !cgo || nobcg729

package g729

// Available reports whether the package was built with bcg729.
const Available = false

// Encoder is unavailable without bcg729.
type Encoder struct{}

// NewEncoder returns ErrUnavailable.
func NewEncoder(bool) (*Encoder, error) { return nil, ErrUnavailable }

// Encode returns ErrUnavailable.
func (*Encoder) Encode(dst []byte, _ []int16) ([]byte, int, error) { return dst, 0, ErrUnavailable }

// ComfortNoise returns ErrUnavailable.
func (*Encoder) ComfortNoise([]byte) ([]byte, error) { return nil, ErrUnavailable }

// Close does nothing.
func (*Encoder) Close() {}

// Decoder is unavailable without bcg729.
type Decoder struct{}

// NewDecoder returns ErrUnavailable.
func NewDecoder() (*Decoder, error) { return nil, ErrUnavailable }

// Decode returns ErrUnavailable.
func (*Decoder) Decode(dst []int16, _ []byte) ([]int16, error) { return dst, ErrUnavailable }

// Conceal returns ErrUnavailable.
func (*Decoder) Conceal(dst []int16, _ int) ([]int16, error) { return dst, ErrUnavailable }

// Close does nothing.
func (*Decoder) Close() {}
