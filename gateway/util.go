package gateway

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/reason"
	"github.com/klauspost/compress/zstd"
)

// decompress reads a body sent with a content coding (RFC 9110 8.4.1),
// its name in any case: gzip (or x-gzip); deflate — zlib's wrapping, as
// the RFC defines it, or the raw deflate some clients send under that
// name, told apart by zlib's two-byte header as browsers do; and zstd,
// which Codex sends to OpenAI's own backend, its window held to the 8 MB
// RFC 9659 sets for the content coding so that a frame cannot make the
// decoder allocate more. The caller closes what it returns.
func decompress(enc string, r io.Reader) (io.ReadCloser, error) {
	switch strings.ToLower(strings.TrimSpace(enc)) {
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, reason.Wrap(reason.Invalid, "bad gzip body", err)
		}
		return zr, nil
	case "deflate":
		br := bufio.NewReader(r)
		if h, err := br.Peek(2); err == nil && zlibHeader(h) {
			zr, err := zlib.NewReader(br)
			if err != nil {
				return nil, reason.Wrap(reason.Invalid, "bad deflate body", err)
			}
			return zr, nil
		}
		return flate.NewReader(br), nil
	case "zstd":
		// One decoder a body, decoding in the request's goroutine.
		zr, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(zstdMaxWindow), zstd.WithDecoderLowmem(true))
		if err != nil {
			return nil, reason.Wrap(reason.Invalid, "bad zstd body", err)
		}
		return zr.IOReadCloser(), nil
	}
	return nil, fmt.Errorf("%w: Content-Encoding %s (imgctx reads gzip, deflate and zstd)", engine.ErrUnsupported, enc)
}

// zstdMaxWindow is the largest window the zstd content coding may use
// (RFC 9659).
const zstdMaxWindow = 8 << 20

// zlibHeader reports whether h opens a zlib stream (RFC 1950): deflate
// with a window of at most 32 KB, and a check that makes the two bytes a
// multiple of 31.
func zlibHeader(h []byte) bool {
	return h[0]&0x0f == 8 && h[0]>>4 <= 7 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0
}

func writeJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

func replyJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	writeJSON(w, v)
}
