package media

import (
	"bytes"
	"encoding/base64"
	"os"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/reason"
)

// Fuzz targets for every decoder of untrusted bytes. Seeds live in
// testdata/fuzz/<Target>/ and below; run one with
//
//	go test ./media -run XXX -fuzz FuzzInspect -fuzztime 60s

func mustRefuseWithReason(t *testing.T, err error) {
	t.Helper()
	if err != nil && reason.Of(err) == "" {
		t.Fatalf("refusal without a reason code: %v", err)
	}
}

func FuzzDecodeBase64(f *testing.F) {
	f.Add("aGVsbG8=")
	f.Add("aGVsbG8")
	f.Add("a-_b\r\nc+/d")
	f.Add("====")
	f.Fuzz(func(t *testing.T, s string) {
		out, err := DecodeBase64(s)
		mustRefuseWithReason(t, err)
		out2, canonical, err2 := DecodeBase64Bytes([]byte(s))
		if (err == nil) != (err2 == nil) || !bytes.Equal(out, out2) {
			t.Fatalf("DecodeBase64Bytes disagrees with DecodeBase64 on %q", s)
		}
		if canonical && len(s) > 0 && base64.StdEncoding.EncodeToString(out2) != s {
			t.Fatalf("%q called canonical, but the standard encoding of its bytes is %q", s, base64.StdEncoding.EncodeToString(out2))
		}
		if err != nil {
			return
		}
		// Whatever was accepted re-encodes to the same significant text.
		clean := strings.TrimRight(strings.Join(strings.Fields(s), ""), "=")
		re := base64.RawStdEncoding.EncodeToString(out)
		if strings.ContainsAny(clean, "-_") {
			re = base64.RawURLEncoding.EncodeToString(out)
		}
		if len(re) != len(clean) {
			t.Fatalf("accepted %q but it decodes to %d bytes", s, len(out))
		}
	})
}

func FuzzParseDataURL(f *testing.F) {
	f.Add("data:image/png;base64,iVBORw0KGgo=")
	f.Add("data:,hello%20world")
	f.Add("data:;base64,")
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDataURL(s)
		mustRefuseWithReason(t, err)
		if err == nil && d.MediaType != strings.ToLower(d.MediaType) {
			t.Fatalf("media type not lower-cased: %q", d.MediaType)
		}
	})
}

func seedImages(f *testing.F) {
	for _, name := range []string{"small.webp", "lossless.webp"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err) // a seed named and missing shrinks the corpus unseen
		}
		f.Add(b)
	}
	f.Add(pngOf(f, 3, 2))
	f.Add(jpegOf(f, 9, 7))
	f.Add(withEXIF(jpegOf(f, 9, 7), 6, 10))
	f.Add(pngHeader(100000, 100000))
	f.Add(gifBomb())
	f.Add([]byte("%PDF-1.4"))
	f.Add([]byte("GIF89a"))
	f.Add([]byte("RIFF\x00\x00\x00\x00WEBPVP8 "))
}

func FuzzInspect(f *testing.F) {
	seedImages(f)
	lim := Limits{MaxPixels: 1 << 20}
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := Inspect(data, "image/png", lim)
		mustRefuseWithReason(t, err)
		if err != nil {
			return
		}
		if in.Kind == KindImage && (in.Width <= 0 || in.Height <= 0 || int64(in.Width)*int64(in.Height) > lim.MaxPixels) {
			t.Fatalf("accepted image with %d×%d", in.Width, in.Height)
		}
		if !in.Ref.Matches(data) {
			t.Fatal("ref does not match the bytes")
		}
	})
}

func FuzzHeaderFromBase64(f *testing.F) {
	f.Add(base64.StdEncoding.EncodeToString(pngOf(f, 5, 5)))
	f.Add(base64.StdEncoding.EncodeToString(withEXIF(jpegOf(f, 5, 5), 3, 2000)))
	f.Add("R0lGODlh")
	f.Fuzz(func(t *testing.T, s string) {
		_, w, h, err := HeaderFromBase64(s, Limits{MaxPixels: 1 << 20})
		mustRefuseWithReason(t, err)
		if err == nil && (w <= 0 || h <= 0) {
			t.Fatalf("accepted %d×%d", w, h)
		}
	})
}

func FuzzJPEGOrientation(f *testing.F) {
	f.Add(withEXIF(jpegOf(f, 4, 4), 6, 0))
	f.Add([]byte{0xFF, 0xD8, 0xFF, 0xE1, 0x00, 0x10, 'E', 'x', 'i', 'f', 0, 0, 'I', 'I', '*', 0, 8, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if o := jpegOrientation(data); o < 0 || o > 8 {
			t.Fatalf("orientation %d out of range", o)
		}
	})
}
