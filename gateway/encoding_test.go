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
	"github.com/klauspost/compress/zstd"
)

// A request body may come compressed (Content-Encoding): gzip, deflate
// as RFC 9110 defines it (zlib's wrapping) or as raw deflate, which some
// clients send under the same name, and zstd (Codex compresses with it),
// its window no wider than RFC 9659's 8 MB; the coding's name in any
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
	zst := compress(func(b *bytes.Buffer) io.WriteCloser {
		w, _ := zstd.NewWriter(b, zstd.WithEncoderLevel(zstd.SpeedDefault)) // Codex's level 3
		return w
	})
	// A frame that asks for a 16 MB window, past RFC 9659's 8 MB: its
	// window descriptor (after the magic and a descriptor byte without
	// the single-segment flag) set to 2^(10+14).
	wide := compress(func(b *bytes.Buffer) io.WriteCloser {
		w, _ := zstd.NewWriter(b, zstd.WithSingleSegment(false))
		return w
	})
	if wide[4]&0x20 != 0 {
		t.Fatalf("the frame is single-segment: no window descriptor to widen")
	}
	wide[5] = 14 << 3
	bomb := compress(func(b *bytes.Buffer) io.WriteCloser {
		w, _ := zstd.NewWriter(b)
		w.Write(bytes.Repeat([]byte("x"), 9<<20)) // the body before it: 9 MB past the 8 MB limit
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
		{"zstd", "zstd", zst},
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
		{"not zstd", "zstd", body, 400, ""},
		{"a zstd window past 8 MB", "zstd", wide, 400, "window"},
		{"a zstd bomb", "zstd", bomb, 413, "8388608 bytes"},
		{"brotli", "br", body, 415, "Content-Encoding br (imgctx reads gzip, deflate and zstd)"},
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

// zstdEncoder is one encoder for every fuzz input: making one costs more
// than compressing a small input.
var zstdEncoder, _ = zstd.NewWriter(nil)

// Any bytes under any coding imgctx reads: an error or at most what the
// reader is allowed, never a panic; and what an encoder wrote comes back
// as it was.
func FuzzDecompress(f *testing.F) {
	for _, seed := range []string{`{"model":"gpt-4o"}`, "", "\x78\x9c", "\x28\xb5\x2f\xfd\x04\x70", "\x1f\x8b\x08"} {
		f.Add([]byte(seed), uint8(0))
	}
	codings := []string{"gzip", "deflate", "zstd"}
	f.Fuzz(func(t *testing.T, data []byte, which uint8) {
		enc := codings[int(which)%len(codings)]
		if d, err := decompress(enc, bytes.NewReader(data)); err == nil {
			out, _ := io.ReadAll(io.LimitReader(d, 1<<20))
			d.Close()
			if len(out) > 1<<20 {
				t.Fatalf("%s: read %d bytes past the limit", enc, len(out))
			}
		}
		var b bytes.Buffer
		var w io.WriteCloser
		switch enc {
		case "gzip":
			w = gzip.NewWriter(&b)
		case "deflate":
			if which&0x80 != 0 { // raw deflate, as some clients send it
				w, _ = flate.NewWriter(&b, flate.BestSpeed)
			} else {
				w = zlib.NewWriter(&b)
			}
		case "zstd":
			b.Write(zstdEncoder.EncodeAll(data, nil))
		}
		if w != nil {
			w.Write(data)
			w.Close()
		}
		d, err := decompress(enc, &b)
		if err != nil {
			t.Fatalf("%s: %v", enc, err)
		}
		defer d.Close()
		if out, err := io.ReadAll(d); err != nil || !bytes.Equal(out, data) {
			t.Fatalf("%s: %d bytes back of %d (%v)", enc, len(out), len(data), err)
		}
	})
}

// What Codex sends to OpenAI's backend: a Responses body with a
// screenshot, compressed with zstd. The upstream gets the client's JSON
// byte for byte, and the screenshot is stored like any other.
func TestAZstdResponsesBodyIsManagedLikeAnyOther(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	body := []byte(`{"model":"gpt-4o","stream":false,"input":[{"role":"user","content":[{"type":"input_text","text":"What is on the screen?"},` +
		`{"type":"input_image","image_url":"data:image/png;base64,` + b64 + `"}]}]}`)
	var z bytes.Buffer
	w, _ := zstd.NewWriter(&z, zstd.WithEncoderLevel(zstd.SpeedDefault))
	w.Write(body)
	w.Close()
	resp, out := g.do(t, "POST", "/v1/responses", "", z.Bytes(), "Content-Encoding", "zstd")
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, out)
	}
	got := g.up.received()
	if len(got) != 1 || !bytes.Equal(got[0], body) {
		t.Fatalf("the upstream did not get the client's JSON as it was:\n%.300s", got)
	}
	if n := g.stored(t, "default"); n != 1 {
		t.Fatalf("%d images stored, want the screenshot", n)
	}
}

// A compressed body is admitted by its length, but held decompressed: as
// it decompresses, what it takes past that is counted in the bytes in
// flight, a megabyte at a time, and a body that would take more than is
// left is refused (429, Retry-After) before it is held whole; what it
// took is given back. A compressed body that fits goes through.
func TestACompressedBodyIsCountedAsItDecompresses(t *testing.T) {
	g := newGWWith(t, upstream.OpenAI, Config{MaxBodyBytes: 8 << 20, MaxInflightBytes: 4 << 20}, discardLogger())
	gz := func(n int) []byte {
		var b bytes.Buffer
		w := gzip.NewWriter(&b)
		w.Write([]byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", n) + `"}]}`))
		w.Close()
		return b.Bytes()
	}
	big := gz(6 << 20) // about 6 KB on the wire
	resp, out := g.do(t, "POST", "/v1/chat/completions", "", big, "Content-Encoding", "gzip")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || !strings.Contains(string(out), "more than 4194304 bytes of request bodies in flight") {
		t.Fatalf("%d (Retry-After %q) %s; want 429 on the bytes in flight", resp.StatusCode, resp.Header.Get("Retry-After"), out)
	}
	if len(g.up.received()) != 0 {
		t.Fatal("the refused body reached the upstream")
	}
	if resp, out := g.do(t, "POST", "/v1/chat/completions", "", gz(2<<20), "Content-Encoding", "gzip"); resp.StatusCode != 200 {
		t.Fatalf("a 2 MB body within the bound: %d %s", resp.StatusCode, out)
	}
	g.done.wait()
	g.server.mu.Lock()
	defer g.server.mu.Unlock()
	if g.server.inflight != 0 || g.server.inflightBytes != 0 || len(g.server.perTenant) != 0 {
		t.Fatalf("after both: %d requests, %d bytes in flight, %v", g.server.inflight, g.server.inflightBytes, g.server.perTenant)
	}
}
