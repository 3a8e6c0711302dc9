package media

import (
	"encoding/base64"
	"testing"
)

func TestDecodeBase64BytesSaysWhenTheTextIsTheEncoding(t *testing.T) {
	for _, c := range []struct {
		in        string
		canonical bool
	}{
		{"aGVsbG8=", true},
		{"aGVsbG8h", true},
		{"aGVs\nbG8=", false}, // a line break: decodes, but is not the encoding
		{"aGVsbG8", false},    // padding missing
		{"aGVsbG9=", false},   // unused bits set in the final group
		{"aGVs-G8=", false},   // URL-safe alphabet
	} {
		data, canonical, err := DecodeBase64Bytes([]byte(c.in))
		if err != nil {
			t.Fatalf("%q: %v", c.in, err)
		}
		if canonical != c.canonical {
			t.Errorf("%q: canonical = %v, want %v", c.in, canonical, c.canonical)
		}
		if canonical && base64.StdEncoding.EncodeToString(data) != c.in {
			t.Errorf("%q: canonical, but encodes to %q", c.in, base64.StdEncoding.EncodeToString(data))
		}
	}
}
