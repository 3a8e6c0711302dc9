package media

import (
	"bytes"
	"compress/zlib"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"image"
	_ "image/gif" // register decoders for image.DecodeConfig / image.Decode
	_ "image/jpeg"
	_ "image/png"
	"io"
	"strings"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/mimetype"
	"github.com/imgctx/imgctx/reason"
	_ "golang.org/x/image/webp"
)

// ErrUnsupported is wrapped by the refusal of bytes in no accepted format,
// so callers can tell "unsupported" (HTTP 415) from "malformed" (400).
var ErrUnsupported = errors.New("unsupported format")

// Kind tells images from documents.
type Kind string

const (
	KindImage    Kind = "image"
	KindDocument Kind = "document"
)

// Sniff names the format of data from its magic bytes: PNG, JPEG, GIF and
// WebP are images, PDF is a document. ok is false for anything else.
func Sniff(data []byte) (mediaType string, kind Kind, ok bool) {
	switch {
	case bytes.HasPrefix(data, []byte("\x89PNG\r\n\x1a\n")):
		return "image/png", KindImage, true
	case bytes.HasPrefix(data, []byte{0xFF, 0xD8, 0xFF}):
		return "image/jpeg", KindImage, true
	case bytes.HasPrefix(data, []byte("GIF87a")), bytes.HasPrefix(data, []byte("GIF89a")):
		return "image/gif", KindImage, true
	case len(data) >= 12 && string(data[:4]) == "RIFF" && string(data[8:12]) == "WEBP":
		return "image/webp", KindImage, true
	case bytes.HasPrefix(data, []byte("%PDF-")):
		return "application/pdf", KindDocument, true
	}
	return "", "", false
}

// Limits bound what Inspect accepts. Zero fields take the defaults.
type Limits struct {
	MaxBytes    int64 // bytes per image or document; default 10 MB
	MaxPixels   int64 // width × height; default 40 MP
	MaxPDFPages int   // pages of a PDF; default 1,000
	// MaxPDFInflated bounds what a PDF's compressed (FlateDecode) streams
	// inflate to, together; default 128 MB: a reader that inflated a
	// deflate bomb (1,000 to 1) would run out of memory.
	MaxPDFInflated int64
}

// Default limits.
const (
	DefaultMaxBytes       = 10 << 20
	DefaultMaxPixels      = 40_000_000
	DefaultMaxPDFPages    = 1000
	DefaultMaxPDFInflated = 128 << 20
)

func (l Limits) maxPDFInflated() int64 {
	if l.MaxPDFInflated > 0 {
		return l.MaxPDFInflated
	}
	return DefaultMaxPDFInflated
}

func (l Limits) maxPDFPages() int {
	if l.MaxPDFPages > 0 {
		return l.MaxPDFPages
	}
	return DefaultMaxPDFPages
}

func (l Limits) maxBytes() int64 {
	if l.MaxBytes > 0 {
		return l.MaxBytes
	}
	return DefaultMaxBytes
}

func (l Limits) maxPixels() int64 {
	if l.MaxPixels > 0 {
		return l.MaxPixels
	}
	return DefaultMaxPixels
}

// Info is what Inspect learned about accepted bytes.
type Info struct {
	Ref       blob.Ref
	MediaType string // sniffed; the declared type never wins
	Kind      Kind
	Bytes     int64
	Width     int // as displayed (EXIF orientation applied); 0 for documents
	Height    int
	Pages     int // a PDF's pages (at least 1); 0 for images
	// Declared is the caller's declared type when it disagreed with the
	// bytes ("" when it agreed or none was given). Report it; don't trust it.
	Declared string
}

// Inspect checks untrusted bytes: not empty, under the byte limit, a known
// format by magic bytes, and for images a readable header whose pixel count
// is under the limit. Only the header is read: a decompression bomb is
// refused without being allocated.
func Inspect(data []byte, declared string, lim Limits) (Info, error) {
	if len(data) == 0 {
		return Info{}, reason.New(reason.Invalid, "empty body: no image bytes")
	}
	if int64(len(data)) > lim.maxBytes() {
		return Info{}, reason.New(reason.TooLarge, fmt.Sprintf("%d bytes is over the limit of %d bytes", len(data), lim.maxBytes()))
	}
	mt, kind, ok := Sniff(data)
	if !ok {
		return Info{}, reason.Wrap(reason.Invalid, describeUnknown(data)+"; accepted: PNG, JPEG, GIF, WebP, PDF", ErrUnsupported)
	}
	in := Info{Ref: blob.Of(data), MediaType: mt, Kind: kind, Bytes: int64(len(data))}
	if d := mimetype.Sanitize(declared); declared != "" && d != mt && !(d == "image/jpg" && mt == "image/jpeg") {
		in.Declared = d
	}
	if kind == KindImage {
		w, h, err := Dimensions(data, lim)
		if err != nil {
			return Info{}, err
		}
		if !complete(data, mt) {
			return Info{}, reason.New(reason.Invalid, "truncated image: "+mt+" without its end marker")
		}
		if mt == "image/png" {
			if err := pngChunks(data); err != nil {
				return Info{}, err
			}
		}
		in.Width, in.Height = w, h
	}
	if mt == "application/pdf" {
		pages, err := checkPDF(data, lim)
		if err != nil {
			return Info{}, err
		}
		in.Pages = pages
	}
	return in, nil
}

// PDFPages counts a PDF's page objects ("/Type /Page", not "/Pages")
// without parsing it. Page objects inside compressed object streams are not
// seen: then the count falls back to one page per 50 KB, at least one.
func PDFPages(data []byte) int {
	n := 0
	for i := 0; ; {
		k := bytes.Index(data[i:], []byte("/Type"))
		if k < 0 {
			break
		}
		j := skipSpace(data, i+k+len("/Type"))
		if bytes.HasPrefix(data[j:], []byte("/Page")) {
			if e := j + len("/Page"); e == len(data) || !isLetter(data[e]) {
				n++
			}
		}
		i = j
	}
	if n == 0 {
		n = max(1, len(data)/(50<<10))
	}
	return n
}

// checkPDF reads enough of a PDF to refuse a malformed or absurd one
// before it is stored or forwarded: it must end as a PDF ends (%%EOF in
// its last kilobyte, where readers look for it: bytes after a "%PDF-"
// header alone are not one), and its page tree may declare no more pages
// than the limit (/Count). It returns the page count: the page tree's when it declares
// one, else PDFPages's.
func checkPDF(data []byte, lim Limits) (int, error) {
	tail := data[max(0, len(data)-1024):]
	if !bytes.Contains(tail, []byte("%%EOF")) {
		return 0, reason.New(reason.Invalid, "malformed PDF: no %%EOF at its end (truncated, or not a PDF)")
	}
	pages := PDFPages(data)
	if declared := pdfCount(data); declared > 0 {
		pages = declared
	}
	if pages > lim.maxPDFPages() {
		return 0, reason.New(reason.TooLarge, fmt.Sprintf("a PDF of %d pages is over the limit of %d pages (media.max_pdf_pages)", pages, lim.maxPDFPages()))
	}
	if n := pdfInflated(data, lim.maxPDFInflated()); n > lim.maxPDFInflated() {
		return 0, reason.New(reason.TooLarge, fmt.Sprintf("a PDF whose compressed streams inflate past %d MB (media.max_pdf_inflated): a deflate bomb", lim.maxPDFInflated()>>20))
	}
	return pages, nil
}

// pdfInflated is how many bytes the PDF's FlateDecode streams inflate to,
// together, counted up to past limit at most: each stream is inflated into
// a discarding counter, never held. A stream that does not inflate counts
// what it gave before its error (a reader would fail on it, no bomb).
func pdfInflated(data []byte, limit int64) int64 {
	var total int64
	for i := 0; total <= limit; {
		k := bytes.Index(data[i:], []byte("stream"))
		if k < 0 {
			break
		}
		at := i + k
		i = at + len("stream")
		if at >= 3 && string(data[at-3:at]) == "end" {
			continue
		}
		start := i
		if start < len(data) && data[start] == '\r' {
			start++
		}
		if start >= len(data) || data[start] != '\n' {
			continue // not the stream keyword
		}
		start++
		dict := data[max(0, bytes.LastIndex(data[:at], []byte("obj"))):at]
		if !bytes.Contains(dict, []byte("/FlateDecode")) {
			continue
		}
		end := bytes.Index(data[start:], []byte("endstream"))
		if end < 0 {
			end = len(data) - start
		}
		if z, err := zlib.NewReader(bytes.NewReader(data[start : start+end])); err == nil {
			n, _ := io.Copy(io.Discard, io.LimitReader(z, limit-total+1))
			total += n
		}
		i = start + end
	}
	return total
}

// pdfCount is the largest /Count a page tree node declares (the root's is
// the document's), 0 when none is readable.
func pdfCount(data []byte) int {
	most := 0
	for i := 0; ; {
		k := bytes.Index(data[i:], []byte("/Count"))
		if k < 0 {
			return most
		}
		j := skipSpace(data, i+k+len("/Count"))
		n, digits := 0, 0
		for ; j < len(data) && data[j] >= '0' && data[j] <= '9' && digits < 10; j++ {
			n = n*10 + int(data[j]-'0')
			digits++
		}
		if digits == 10 || n > 1<<30 {
			n = 1 << 30 // absurd: counts as over any limit
		}
		most = max(most, n)
		i = j
	}
}

// skipSpace is the offset of the first byte at or after j that is not PDF
// white space.
func skipSpace(data []byte, j int) int {
	for j < len(data) && (data[j] == ' ' || data[j] == '\n' || data[j] == '\r' || data[j] == '\t') {
		j++
	}
	return j
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// pngChunks checks every chunk's CRC up to IEND: a corrupt IDAT or a bad
// chunk passes a header check but fails in the provider's decoder. A CRC
// pass costs far less than a decode and needs no memory.
func pngChunks(data []byte) error {
	for i := 8; i+12 <= len(data); {
		n := int(binary.BigEndian.Uint32(data[i:]))
		if n < 0 || n > len(data)-i-12 {
			return reason.New(reason.Invalid, fmt.Sprintf("corrupt PNG: a chunk at byte %d runs past the end", i))
		}
		body := data[i+4 : i+8+n]
		if crc32.ChecksumIEEE(body) != binary.BigEndian.Uint32(data[i+8+n:]) {
			return reason.New(reason.Invalid, fmt.Sprintf("corrupt PNG: bad CRC in the %q chunk at byte %d", body[:4], i))
		}
		if string(body[:4]) == "IEND" {
			return nil
		}
		i += 12 + n
	}
	return reason.New(reason.Invalid, "corrupt PNG: no IEND chunk")
}

// complete checks, without decoding, that an image is not cut short: PNG
// has its IEND chunk, JPEG its end-of-image marker, GIF its trailer, WebP
// all the bytes its RIFF header declares. Trailing bytes after the end
// marker are tolerated, as decoders tolerate them.
func complete(data []byte, mt string) bool {
	tail := data[max(0, len(data)-1024):]
	switch mt {
	case "image/png":
		return bytes.Contains(tail, []byte("IEND"))
	case "image/jpeg":
		return bytes.Contains(tail, []byte{0xFF, 0xD9})
	case "image/gif":
		return bytes.IndexByte(data[max(0, len(data)-64):], 0x3B) >= 0
	case "image/webp":
		return len(data) >= 12 && int64(binary.LittleEndian.Uint32(data[4:8]))+8 <= int64(len(data))
	}
	return true
}

// Dimensions reads width and height from an image header and checks the
// pixel limit. It never decodes pixels. Rotated JPEGs (EXIF orientation 5-8)
// report their displayed size.
func Dimensions(data []byte, lim Limits) (w, h int, err error) {
	cfg, _, err := image.DecodeConfig(bytes.NewReader(data))
	if err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return 0, 0, reason.Wrap(reason.Invalid, "truncated image header", err)
		}
		return 0, 0, reason.Wrap(reason.Invalid, "unreadable image header", err)
	}
	w, h = cfg.Width, cfg.Height
	if w <= 0 || h <= 0 {
		return 0, 0, reason.New(reason.Invalid, fmt.Sprintf("image header claims %d×%d", w, h))
	}
	if px := int64(w) * int64(h); px > lim.maxPixels() {
		return 0, 0, reason.New(reason.TooLarge, fmt.Sprintf("%d×%d is %d pixels, over the limit of %d", w, h, px, lim.maxPixels()))
	}
	if o := jpegOrientation(data); o >= 5 {
		w, h = h, w
	}
	return w, h, nil
}

// HeaderFromBase64 reads an image's type and dimensions from the start of
// its base64 text, decoding only as much as the header needs: a few hundred
// bytes for PNG, GIF and WebP; for JPEG, whose frame header can sit behind
// metadata, the marker segments say exactly how far to read.
func HeaderFromBase64(b64 string, lim Limits) (mediaType string, w, h int, err error) {
	n := 512 // base64 characters: 384 bytes
	for {
		prefix, whole := base64Prefix(b64, n)
		data, derr := DecodeBase64(prefix)
		if derr != nil {
			return "", 0, 0, derr
		}
		mt, kind, ok := Sniff(data)
		if !ok {
			return "", 0, 0, reason.Wrap(reason.Invalid, describeUnknown(data), ErrUnsupported)
		}
		if kind != KindImage {
			return "", 0, 0, reason.New(reason.Invalid, mt+" is a document, not an image")
		}
		if mt == "image/jpeg" && !whole {
			if w, h, ok := jpegSizeFromBase64(b64); ok {
				if px := int64(w) * int64(h); px > lim.maxPixels() {
					return "", 0, 0, reason.New(reason.TooLarge, fmt.Sprintf("%d×%d is %d pixels, over the limit of %d", w, h, px, lim.maxPixels()))
				}
				return mt, w, h, nil
			}
			if need, found, ok := jpegHeaderNeed(data); ok && (!found || need > len(data)) {
				n = max(n+4, (need+1024+2)/3*4)
				continue
			}
		}
		w, h, err = Dimensions(data, lim)
		if err == nil || whole || reason.Of(err) == reason.TooLarge {
			return mt, w, h, err
		}
		n *= 2
	}
}

// base64Prefix returns the shortest prefix of s holding n significant
// (non-space) characters, and whether that is all of s.
func base64Prefix(s string, n int) (string, bool) {
	end, from := min(n, len(s)), 0
	for end < len(s) {
		spaces := 0
		for i := from; i < end; i++ {
			if b64Class[s[i]] == b64Space {
				spaces++
			}
		}
		if spaces == 0 {
			break
		}
		from, end = end, min(end+spaces, len(s))
	}
	return s[:end], end == len(s)
}

// describeUnknown gives a hint about bytes that are no known format.
func describeUnknown(data []byte) string {
	head := data[:min(len(data), 512)]
	switch {
	case bytes.HasPrefix(head, []byte("<svg")) || bytes.Contains(head, []byte("<svg")):
		return "SVG is not supported (send PNG)"
	case isText(head):
		return "the bytes are text, not an image"
	}
	return "unknown magic bytes"
}

func isText(b []byte) bool {
	for _, c := range b {
		if c < 0x09 || (c > 0x0d && c < 0x20) || c == 0x7f {
			return false
		}
	}
	return !strings.ContainsRune(string(b), '\uFFFD')
}
