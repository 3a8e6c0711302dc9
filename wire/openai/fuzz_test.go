package openai

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/wiretest"
)

// Fuzz targets for every decoder of upstream and client bytes:
//
//	go test ./wire/openai -run XXX -fuzz FuzzDecodeRequest -fuzztime 60s

func FuzzDecodeRequest(f *testing.F) {
	wiretest.Seed(f, "request.json")
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			return
		}
		// Whatever decodes re-encodes, and the re-encoding decodes the same.
		out, err := r.Encode(r.Messages, func(img chat.Image) (string, string, string, error) { return "", "", img.URL, nil })
		if err != nil {
			t.Fatalf("decoded but cannot encode: %v", err)
		}
		if _, err := DecodeRequest(out); err != nil {
			t.Fatalf("re-encoding does not decode: %v\n%s", err, out)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	wiretest.Seed(f, "response.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeResponse(b)
		if err == nil && r.Message.Role == "" {
			t.Fatal("a response without a role")
		}
	})
}

func FuzzStream(f *testing.F) {
	wiretest.Seed(f, "stream.sse", "stream-cut.sse")
	f.Fuzz(func(t *testing.T, b []byte) {
		sr := wire.NewSSEReader(bytes.NewReader(b))
		var s Stream
		for range 10000 {
			ev, err := sr.Next()
			if err != nil {
				if err != io.EOF && err != io.ErrShortBuffer && err != io.ErrUnexpectedEOF {
					t.Fatalf("reader: %v", err)
				}
				break
			}
			_ = s.Add(ev.Data)
		}
		_ = s.Response()
	})
}

func FuzzDecodeError(f *testing.F) {
	wiretest.Seed(f, "error-context.json", "error-ratelimit.json", "error-server.html")
	f.Fuzz(func(t *testing.T, b []byte) {
		e := DecodeError(400, http.Header{}, b)
		if e.Kind == "" || e.Status != 400 {
			t.Fatalf("unclassified: %+v", e)
		}
	})
}

// FuzzScan: any body either is refused or scans to spans that hold
// together (wiretest.CheckSpliced); the scan never panics.
//
//	go test ./wire/openai -run XXX -fuzz FuzzScan -fuzztime 60s
func FuzzScan(f *testing.F) {
	wiretest.Seed(f, "request.json", "../../../testdata/requests/openai-agent.json")
	wiretest.FuzzScan(f, Scan)
}

// FuzzResume: a scan resumed from any earlier body's gives a full scan's
// result.
//
//	go test ./wire/openai -run XXX -fuzz FuzzResume -fuzztime 60s
func FuzzResume(f *testing.F) {
	for _, name := range []string{"testdata/request.json", "../../testdata/requests/openai-agent.json"} {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b, b)
			f.Add(b[:len(b)/2], b)
		}
	}
	wiretest.FuzzResume(f, Scan)
}
