package oai

import (
	"encoding/binary"
	"math/bits"
	"testing"

	"pgregory.net/rapid"
)

// firstSpecial is the reference for special8: the index of the first byte
// that is not plain, or 8.
func firstSpecial(b []byte) int {
	for i, c := range b {
		if !plain[c] {
			return i
		}
	}
	return 8
}

func TestSpecial8(t *testing.T) {
	check := func(t interface{ Fatalf(string, ...any) }, b []byte) {
		got := bits.TrailingZeros64(special8(binary.LittleEndian.Uint64(b))) >> 3
		if want := firstSpecial(b); got != want {
			t.Fatalf("special8(%q) finds byte %d, want %d", b, got, want)
		}
	}
	// Every byte value in every lane, among plain bytes.
	for c := range 256 {
		for lane := range 8 {
			b := []byte("abcdefgh")
			b[lane] = byte(c)
			check(t, b)
		}
	}
	// Random words, biased towards the boundaries of each class.
	edge := rapid.SampledFrom([]byte{0x00, 0x01, 0x1f, 0x20, 0x21, '"', '#', '[', '\\', ']', 0x7e, 0x7f, 0x80, 0x81, 0xa0, 0xdf, 0xfe, 0xff, 'a'})
	rapid.Check(t, func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.OneOf(edge, rapid.Byte()), 8, 8).Draw(t, "bytes")
		check(t, b)
	})
}
