package anthropic

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"testing"

	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/wiretest"
)

// Fuzz targets for every decoder:
//
//	go test ./wire/anthropic -run XXX -fuzz FuzzDecodeRequest -fuzztime 60s

func FuzzDecodeRequest(f *testing.F) {
	wiretest.Seed(f, "request.json")
	f.Add([]byte(`{"messages":[{"role":"user","content":"hi"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeRequest(b)
		if err != nil {
			return
		}
		out, err := r.Encode(r.Messages, passSource, Cache{})
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
	f.Fuzz(func(t *testing.T, b []byte) { DecodeResponse(b) })
}

func FuzzStream(f *testing.F) {
	wiretest.Seed(f, "stream.sse", "stream-window.sse", "stream-error.sse")
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
			_ = s.Add(ev.Name, ev.Data)
		}
		_ = s.Response()
	})
}

func FuzzDecodeError(f *testing.F) {
	wiretest.Seed(f, "error-prompt.json", "error-overloaded.json")
	f.Fuzz(func(t *testing.T, b []byte) {
		if e := DecodeError(400, http.Header{}, b); e.Kind == "" {
			t.Fatal("unclassified")
		}
	})
}

// FuzzScan: any body either is refused or scans to spans that hold
// together (wiretest.CheckSpliced); the scan never panics.
//
//	go test ./wire/anthropic -run XXX -fuzz FuzzScan -fuzztime 60s
func FuzzScan(f *testing.F) {
	wiretest.Seed(f, "request.json", "../../../testdata/requests/anthropic-agent.json")
	// Small bodies of every block shape that holds images, so a short
	// fuzzing budget (CI's) mutates them many times a second.
	for _, block := range []string{
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo="}}`,
		`{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}`,
		`{"type":"search_result","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}`,
		`{"type":"mcp_tool_result","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}`,
		`{"content":[{"type":"image","source":{"type":"base64","data":"iVBO"}}]}`,
		`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"JVBE"}}`,
	} {
		f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[` + block + `]}]}`))
	}
	wiretest.FuzzScan(f, Scan)
}

// FuzzResume: a scan resumed from any earlier body's gives a full scan's
// result.
//
//	go test ./wire/anthropic -run XXX -fuzz FuzzResume -fuzztime 60s
func FuzzResume(f *testing.F) {
	for _, name := range []string{"testdata/request.json", "../../testdata/requests/anthropic-agent.json"} {
		if b, err := os.ReadFile(name); err == nil {
			f.Add(b, b)
			f.Add(b[:len(b)/2], b)
		}
	}
	wiretest.FuzzResume(f, Scan)
}
