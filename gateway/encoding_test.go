package gateway

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"io"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
)

// A request body may come compressed (Content-Encoding): gzip, and
// deflate as RFC 9110 defines it (zlib's wrapping) or as raw deflate,
// which some clients send under the same name; the coding's name in any
// case. The upstream gets the body as JSON, without the header. A body
// that does not decode is refused (400), a coding imgctx does not read
// too (415, naming the ones it does), and neither reaches the upstream.
func TestCompressedRequestBodies(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	body := []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)
	compress := func(w func(*bytes.Buffer) io.WriteCloser) []byte {
		var b bytes.Buffer
		z := w(&b)
		z.Write(body)
		z.Close()
		return b.Bytes()
	}
	gz := compress(func(b *bytes.Buffer) io.WriteCloser { return gzip.NewWriter(b) })
	zl := compress(func(b *bytes.Buffer) io.WriteCloser { return zlib.NewWriter(b) })
	raw := compress(func(b *bytes.Buffer) io.WriteCloser {
		w, _ := flate.NewWriter(b, flate.DefaultCompression)
		return w
	})
	for _, c := range []struct {
		name, enc string
		body      []byte
	}{
		{"gzip", "gzip", gz},
		{"GZIP", "GZIP", gz},
		{"x-gzip", "x-gzip", gz},
		{"deflate (zlib)", "deflate", zl},
		{"deflate (raw)", "deflate", raw},
	} {
		before := len(g.up.received())
		resp, b := g.do(t, "POST", "/v1/chat/completions", "", c.body, "Content-Encoding", c.enc)
		if resp.StatusCode != 200 {
			t.Errorf("%s: %d %s", c.name, resp.StatusCode, b)
			continue
		}
		got := g.up.received()
		if len(got) != before+1 || !bytes.Contains(got[len(got)-1], []byte(`"content":"hi"`)) {
			t.Errorf("%s: the upstream did not get the decoded body", c.name)
		}
	}
	before := len(g.up.received())
	for _, c := range []struct {
		name, enc string
		body      []byte
		status    int
		says      string
	}{
		{"not gzip", "gzip", body, 400, "bad gzip body"},
		{"cut short", "gzip", gz[:len(gz)/2], 400, ""},
		{"not deflate", "deflate", body, 400, ""},
		{"brotli", "br", body, 415, "Content-Encoding br"},
	} {
		resp, b := g.do(t, "POST", "/v1/chat/completions", "", c.body, "Content-Encoding", c.enc)
		if resp.StatusCode != c.status || !strings.Contains(string(b), c.says) {
			t.Errorf("%s: %d %s; want %d saying %q", c.name, resp.StatusCode, b, c.status, c.says)
		}
	}
	if n := len(g.up.received()) - before; n != 0 {
		t.Fatalf("%d refused bodies reached the upstream", n)
	}
}
