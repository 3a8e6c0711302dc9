package media

import (
	"bytes"
	"compress/zlib"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"image"
	"image/color"
	"image/gif"
	"image/jpeg"
	"image/png"
	"os"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/reason"
)

func pngOf(t testing.TB, w, h int) []byte {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			img.Set(x, y, color.RGBA{uint8(x), uint8(y), uint8(x ^ y), 255})
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func jpegOf(t testing.TB, w, h int) []byte {
	var b bytes.Buffer
	img := image.NewGray(image.Rect(0, 0, w, h))
	for i := range img.Pix {
		img.Pix[i] = uint8(i * 7)
	}
	if err := jpeg.Encode(&b, img, nil); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// withEXIF inserts an APP1 segment carrying orientation o (and pad bytes of
// other metadata before it) right after the JPEG's SOI.
func withEXIF(j []byte, o uint16, pad int) []byte {
	tiff := []byte("MM\x00*\x00\x00\x00\x08\x00\x01")
	entry := make([]byte, 12)
	binary.BigEndian.PutUint16(entry[0:], 0x0112)
	binary.BigEndian.PutUint16(entry[2:], 3)
	binary.BigEndian.PutUint32(entry[4:], 1)
	binary.BigEndian.PutUint16(entry[8:], o)
	tiff = append(append(tiff, entry...), 0, 0, 0, 0)
	seg := append([]byte("Exif\x00\x00"), tiff...)
	out := append([]byte{}, j[:2]...)
	if pad > 0 { // an APP2 segment of filler, like an ICC profile
		for pad > 0 {
			n := min(pad, 60000)
			out = append(out, 0xFF, 0xE2, byte((n+2)>>8), byte(n+2))
			out = append(out, make([]byte, n)...)
			pad -= n
		}
	}
	out = append(out, 0xFF, 0xE1, byte((len(seg)+2)>>8), byte(len(seg)+2))
	out = append(out, seg...)
	return append(out, j[2:]...)
}

// pngHeader forges a PNG whose IHDR claims w×h, with nothing after it.
func pngHeader(w, h uint32) []byte {
	ihdr := make([]byte, 17)
	copy(ihdr, "IHDR")
	binary.BigEndian.PutUint32(ihdr[4:], w)
	binary.BigEndian.PutUint32(ihdr[8:], h)
	ihdr[12], ihdr[13] = 8, 6 // 8-bit RGBA
	b := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0d")
	b = append(b, ihdr...)
	return binary.BigEndian.AppendUint32(b, crc32.ChecksumIEEE(ihdr))
}

// gifBomb is a valid GIF header whose logical screen is 65535×65535.
func gifBomb() []byte {
	b := []byte("GIF89a\xff\xff\xff\xff\x00\x00\x00")
	// one 1×1 frame so the file is otherwise well formed
	b = append(b, 0x2C, 0, 0, 0, 0, 1, 0, 1, 0, 0, 2, 2, 0x44, 0x01, 0, 0x3B)
	return b
}

func wantReason(t *testing.T, err error, want reason.Code) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error; want reason %s", want)
	}
	if got := reason.Of(err); got != want {
		t.Fatalf("reason %q (%v); want %q", got, err, want)
	}
}

func TestDecodeBase64Dialects(t *testing.T) {
	raw := []byte{0xfb, 0xff, 0xbf, 0x00, 0x01, 0x02, 0x03}
	std := base64.StdEncoding.EncodeToString(raw)
	url := base64.URLEncoding.EncodeToString(raw)
	for name, in := range map[string]string{
		"standard":        std,
		"standard no pad": strings.TrimRight(std, "="),
		"url-safe":        url,
		"url-safe no pad": strings.TrimRight(url, "="),
		"line breaks":     std[:4] + "\r\n" + std[4:8] + "\n " + std[8:],
	} {
		got, err := DecodeBase64(in)
		if err != nil || !bytes.Equal(got, raw) {
			t.Fatalf("%s: got %x, %v; want %x", name, got, err, raw)
		}
	}
}

func TestDecodeBase64Refusals(t *testing.T) {
	for name, in := range map[string]string{
		"empty":            "",
		"only spaces":      "  \n ",
		"truncated":        "iVBORw0KG",
		"wrong alphabet":   "iVBO*w0K",
		"mixed alphabets":  "ab+_cd==",
		"padding inside":   "ab==cdef",
		"too much padding": "a===",
		"unicode":          "iVBORw0Ké",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeBase64(in)
			wantReason(t, err, reason.Invalid)
		})
	}
}

func TestParseDataURL(t *testing.T) {
	p := pngOf(t, 4, 4)
	b64 := base64.StdEncoding.EncodeToString(p)
	for _, in := range []string{
		"data:image/png;base64," + b64,
		"DATA:Image/PNG;name=x.png;base64," + b64,
		" data:image/png;base64," + b64[:10] + "\n" + b64[10:] + " ",
	} {
		d, err := ParseDataURL(in)
		if err != nil || d.MediaType != "image/png" || !bytes.Equal(d.Data, p) {
			t.Fatalf("%.40q: %q %v", in, d.MediaType, err)
		}
	}
	d, err := ParseDataURL("data:text/plain,hello%20world")
	if err != nil || string(d.Data) != "hello world" {
		t.Fatalf("percent-encoded: %q %v", d.Data, err)
	}
	for _, bad := range []string{"http://x/y.png", "data:image/png;base64", "data:image/png;base64,@@@", "data:,%zz"} {
		_, err := ParseDataURL(bad)
		wantReason(t, err, reason.Invalid)
	}
}

func TestInspectFormats(t *testing.T) {
	webp, err := os.ReadFile("testdata/small.webp")
	if err != nil {
		t.Fatal(err)
	}
	lossless, _ := os.ReadFile("testdata/lossless.webp")
	var g bytes.Buffer
	gif.Encode(&g, image.NewPaletted(image.Rect(0, 0, 30, 20), color.Palette{color.Black, color.White}), nil)
	cases := []struct {
		name     string
		data     []byte
		mt       string
		kind     Kind
		w, h     int
		declared string
	}{
		{"png", pngOf(t, 33, 17), "image/png", KindImage, 33, 17, ""},
		{"jpeg", jpegOf(t, 40, 30), "image/jpeg", KindImage, 40, 30, ""},
		{"gif", g.Bytes(), "image/gif", KindImage, 30, 20, ""},
		{"webp lossy", webp, "image/webp", KindImage, 64, 40, ""},
		{"webp lossless", lossless, "image/webp", KindImage, 32, 20, ""},
		{"pdf", []byte("%PDF-1.7\n1 0 obj\n%%EOF\n"), "application/pdf", KindDocument, 0, 0, ""},
		{"rotated jpeg reports displayed size", withEXIF(jpegOf(t, 40, 30), 6, 0), "image/jpeg", KindImage, 30, 40, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in, err := Inspect(c.data, c.mt, Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if in.MediaType != c.mt || in.Kind != c.kind || in.Width != c.w || in.Height != c.h || in.Declared != "" {
				t.Fatalf("got %+v; want %s %s %d×%d", in, c.mt, c.kind, c.w, c.h)
			}
			if in.Bytes != int64(len(c.data)) || !in.Ref.Matches(c.data) {
				t.Fatalf("bytes/ref wrong: %+v", in)
			}
		})
	}
}

func TestInspectReportsDeclaredMismatch(t *testing.T) {
	in, err := Inspect(pngOf(t, 2, 2), "image/jpeg", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if in.MediaType != "image/png" || in.Declared != "image/jpeg" {
		t.Fatalf("sniffed type must win and the declared one be reported: %+v", in)
	}
	if in, _ := Inspect(jpegOf(t, 2, 2), "image/jpg", Limits{}); in.Declared != "" {
		t.Fatalf("image/jpg is an alias, not a disagreement: %+v", in)
	}
}

func TestInspectRefusals(t *testing.T) {
	big := pngOf(t, 10, 10)
	cases := []struct {
		name string
		data []byte
		lim  Limits
		want reason.Code
		msg  string
	}{
		{"empty body", nil, Limits{}, reason.Invalid, "empty"},
		{"text file named .png", []byte("hello, I am not an image\n"), Limits{}, reason.Invalid, "text"},
		{"svg", []byte(`<svg xmlns="http://www.w3.org/2000/svg"></svg>`), Limits{}, reason.Invalid, "SVG"},
		{"unknown binary", []byte{0, 1, 2, 3, 4, 5}, Limits{}, reason.Invalid, "unknown"},
		{"png header claiming 100000x100000", pngHeader(100000, 100000), Limits{}, reason.TooLarge, "10000000000 pixels"},
		{"gif bomb", gifBomb(), Limits{}, reason.TooLarge, "65535×65535"},
		{"truncated png", big[:20], Limits{}, reason.Invalid, "header"},
		{"png cut after its header", big[:len(big)-30], Limits{}, reason.Invalid, "truncated image"},
		{"jpeg cut short", jpegOf(t, 64, 64)[:400], Limits{}, reason.Invalid, "truncated"},
		{"webp cut short", webpFixture(t)[:100], Limits{}, reason.Invalid, "truncated image"},
		{"zero-size png", pngHeader(0, 10), Limits{}, reason.Invalid, ""},
		{"over the byte cap", big, Limits{MaxBytes: 50}, reason.TooLarge, "over the limit of 50 bytes"},
		{"over the pixel cap", big, Limits{MaxPixels: 99}, reason.TooLarge, "100 pixels"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Inspect(c.data, "image/png", c.lim)
			wantReason(t, err, c.want)
			if !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("error %q does not say %q", err, c.msg)
			}
		})
	}
}

func webpFixture(t *testing.T) []byte {
	b, err := os.ReadFile("testdata/small.webp")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestHeaderFromBase64(t *testing.T) {
	p := pngOf(t, 300, 200)
	mt, w, h, err := HeaderFromBase64(base64.StdEncoding.EncodeToString(p), Limits{})
	if err != nil || mt != "image/png" || w != 300 || h != 200 {
		t.Fatalf("png: %s %d×%d %v", mt, w, h, err)
	}
	// A JPEG whose frame header sits behind 100 KB of metadata.
	j := withEXIF(jpegOf(t, 64, 48), 1, 100_000)
	mt, w, h, err = HeaderFromBase64(base64.StdEncoding.EncodeToString(j), Limits{})
	if err != nil || mt != "image/jpeg" || w != 64 || h != 48 {
		t.Fatalf("jpeg behind metadata: %s %d×%d %v", mt, w, h, err)
	}
	// The segment-skipping JPEG path agrees with image.DecodeConfig, EXIF
	// rotation included, behind small and large metadata.
	for _, c := range []struct {
		o   uint16
		pad int
	}{{1, 0}, {6, 0}, {8, 70000}, {3, 5000}} {
		j := withEXIF(jpegOf(t, 64, 48), c.o, c.pad)
		wantW, wantH, err := Dimensions(j, Limits{})
		if err != nil {
			t.Fatal(err)
		}
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawURLEncoding} {
			_, w, h, err := HeaderFromBase64(enc.EncodeToString(j), Limits{})
			if err != nil || w != wantW || h != wantH {
				t.Fatalf("orientation %d pad %d: %d×%d %v; want %d×%d", c.o, c.pad, w, h, err, wantW, wantH)
			}
		}
		// With line breaks the fast path steps aside and the slow one agrees.
		wrapped := strings.Join(strings.SplitAfterN(base64.StdEncoding.EncodeToString(j), "", 1), "")
		var sb strings.Builder
		for i, r := range wrapped {
			if i > 0 && i%76 == 0 {
				sb.WriteString("\r\n")
			}
			sb.WriteRune(r)
		}
		if _, w, h, err := HeaderFromBase64(sb.String(), Limits{}); err != nil || w != wantW || h != wantH {
			t.Fatalf("wrapped, orientation %d: %d×%d %v", c.o, w, h, err)
		}
	}
	// A JPEG bomb is refused from its header too.
	bomb := jpegOf(t, 8, 8)
	for i := 0; i+9 < len(bomb); i++ {
		if bomb[i] == 0xFF && bomb[i+1] == 0xC0 {
			bomb[i+5], bomb[i+6], bomb[i+7], bomb[i+8] = 0xFF, 0xFF, 0xFF, 0xFF
			break
		}
	}
	_, _, _, err = HeaderFromBase64(base64.StdEncoding.EncodeToString(bomb), Limits{})
	wantReason(t, err, reason.TooLarge)
	// A bomb is refused from its prefix alone.
	_, _, _, err = HeaderFromBase64(base64.StdEncoding.EncodeToString(append(pngHeader(100000, 100000), make([]byte, 4096)...)), Limits{})
	wantReason(t, err, reason.TooLarge)
	_, _, _, err = HeaderFromBase64(base64.StdEncoding.EncodeToString([]byte("%PDF-1.4 .................")), Limits{})
	wantReason(t, err, reason.Invalid)
}

func TestPDFPages(t *testing.T) {
	three := []byte("%PDF-1.4\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type /Pages/Kids[3 0 R 4 0 R 5 0 R]/Count 3>>endobj\n" +
		"3 0 obj<</Type/Page>>endobj 4 0 obj<</Type /Page/Parent 2 0 R>>endobj 5 0 obj<</Type\n/Page >>endobj\n%%EOF\n")
	if n := PDFPages(three); n != 3 {
		t.Fatalf("pages %d; want 3", n)
	}
	// Page objects hidden in compressed streams: one page per 50 KB.
	if n := PDFPages(append([]byte("%PDF-1.7\n"), make([]byte, 160<<10)...)); n != 3 {
		t.Fatalf("fallback pages %d; want 3", n)
	}
	in, err := Inspect(three, "application/pdf", Limits{})
	if err != nil || in.Pages != 3 || in.Kind != KindDocument {
		t.Fatalf("Inspect: %+v %v", in, err)
	}
}

// Regression (issue "Hardening", item 12): a PNG with a corrupt IDAT or a
// bad chunk CRC passed (only headers were read); it is refused as invalid.
func TestCorruptPNGIsRefused(t *testing.T) {
	good, err := os.ReadFile("../testdata/screenshot.png")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Inspect(good, "image/png", Limits{}); err != nil {
		t.Fatalf("the good PNG: %v", err)
	}
	idat := bytes.Index(good, []byte("IDAT"))
	bad := append([]byte(nil), good...)
	bad[idat+40] ^= 0xFF // inside the image data: its CRC no longer matches
	_, err = Inspect(bad, "image/png", Limits{})
	if reason.Of(err) != reason.Invalid || !strings.Contains(err.Error(), `bad CRC in the "IDAT" chunk`) {
		t.Fatalf("corrupt IDAT: %v", err)
	}
}

// Issue "Hardening, third pass", item 12: a PDF is read enough to refuse
// a malformed or absurd one — bytes after a "%PDF-" header that do not end
// as a PDF ends, a page tree declaring more pages than the limit — and its
// pages are the page tree's count when it declares one.
func TestInspectRefusesMalformedAndAbsurdPDFs(t *testing.T) {
	random := append([]byte("%PDF-1.7\n"), bytes.Repeat([]byte{0x9c, 0x42, 0x17}, 100_000)...)
	if _, err := Inspect(random, "", Limits{}); reason.Of(err) != reason.Invalid {
		t.Fatalf("random bytes after a PDF header: %v; want invalid", err)
	}
	tree := func(count string) []byte {
		return []byte("%PDF-1.7\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count " + count +
			">>endobj\n3 0 obj<</Type/Page/Parent 2 0 R>>endobj\ntrailer<</Root 1 0 R>>\nstartxref\n0\n%%EOF\n")
	}
	if _, err := Inspect(tree("2147483647"), "", Limits{}); reason.Of(err) != reason.TooLarge || !strings.Contains(err.Error(), "media.max_pdf_pages") {
		t.Fatalf("/Count 2147483647: %v; want too_large naming the limit", err)
	}
	if _, err := Inspect(tree("12"), "", Limits{MaxPDFPages: 10}); reason.Of(err) != reason.TooLarge {
		t.Fatalf("12 pages over a limit of 10: %v", err)
	}
	in, err := Inspect(tree("12"), "", Limits{})
	if err != nil || in.Pages != 12 {
		t.Fatalf("a 12-page tree: %d pages, %v", in.Pages, err)
	}
}

// A deflate bomb — a megabyte of PDF whose content stream inflates to a
// gigabyte (the hardening issue's) — is refused before it is stored or
// forwarded, after inflating no more than the limit; a PDF whose streams
// inflate to an honest size passes, and so does one whose compressed
// stream is corrupt (its reader fails on it: no bomb).
func TestInspectRefusesAPDFDeflateBomb(t *testing.T) {
	pdf := func(stream []byte) []byte {
		var b bytes.Buffer
		b.WriteString("%PDF-1.7\n1 0 obj<</Type/Catalog/Pages 2 0 R>>endobj\n2 0 obj<</Type/Pages/Kids[3 0 R]/Count 1>>endobj\n" +
			"3 0 obj<</Type/Page/Parent 2 0 R/Contents 4 0 R>>endobj\n")
		fmt.Fprintf(&b, "4 0 obj<</Length %d/Filter/FlateDecode>>stream\r\n", len(stream))
		b.Write(stream)
		b.WriteString("\r\nendstream\nendobj\ntrailer<</Root 1 0 R>>\n%%EOF\n")
		return b.Bytes()
	}
	deflated := func(n int64) []byte {
		var z bytes.Buffer
		w, _ := zlib.NewWriterLevel(&z, zlib.BestSpeed)
		zero := make([]byte, 1<<20)
		for ; n > 0; n -= int64(len(zero)) {
			w.Write(zero[:min(n, int64(len(zero)))])
		}
		w.Close()
		return z.Bytes()
	}
	bomb := pdf(deflated(1 << 30))
	if len(bomb) > 2<<20 {
		t.Fatalf("the bomb is %d bytes: want about a megabyte", len(bomb))
	}
	if _, err := Inspect(bomb, "", Limits{}); reason.Of(err) != reason.TooLarge || !strings.Contains(err.Error(), "media.max_pdf_inflated") {
		t.Fatalf("a 1 GB deflate bomb: %v; want too_large naming the limit", err)
	}
	if _, err := Inspect(pdf(deflated(3<<20)), "", Limits{MaxPDFInflated: 2 << 20}); reason.Of(err) != reason.TooLarge {
		t.Fatalf("3 MB inflated over a 2 MB limit: %v", err)
	}
	if in, err := Inspect(pdf(deflated(1<<20)), "", Limits{MaxPDFInflated: 2 << 20}); err != nil || in.Pages != 1 {
		t.Fatalf("1 MB inflated under a 2 MB limit: %+v, %v", in, err)
	}
	if _, err := Inspect(pdf([]byte("not deflate at all")), "", Limits{}); err != nil {
		t.Fatalf("a corrupt compressed stream: %v; want it passed (a reader fails on it, no bomb)", err)
	}
}
