package gateway

import (
	"compress/flate"
	"compress/gzip"
	"encoding/json"
	"io"
	"net/http"

	"github.com/imgctx/imgctx/reason"
)

func decompress(enc string, r io.Reader) (io.Reader, error) {
	switch enc {
	case "gzip":
		zr, err := gzip.NewReader(r)
		if err != nil {
			return nil, reason.Wrap(reason.Invalid, "bad gzip body", err)
		}
		return zr, nil
	case "deflate":
		return flate.NewReader(r), nil
	}
	return nil, reason.New(reason.Invalid, "unsupported Content-Encoding "+enc)
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
