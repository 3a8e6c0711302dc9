package gateway

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/imgctx/imgctx/upstream"
)

// Bodies large enough to be compared as they arrive (arrivingFrom) go
// upstream exactly as sent — the history re-sent, edited in its middle at
// the same length, then grown — with a screenshot inline among them.
func TestArrivingBodiesForwardAsSent(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	history := func(rounds int, edit string) []byte {
		msgs := []string{`{"role":"system","content":"you write code` + strings.Repeat(" carefully", 800) + `"}`,
			`{"role":"user","content":[{"type":"text","text":"this screen"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}`}
		for k := range rounds {
			text := fmt.Sprintf("step %03d %s", k, strings.Repeat("x", 600))
			if k == 30 && edit != "" {
				text = edit + text[len(edit):]
			}
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"%s"}`, text), fmt.Sprintf(`{"role":"assistant","content":"done %03d"}`, k))
		}
		return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]}`)
	}
	bodies := [][]byte{history(100, ""), history(100, ""), history(100, "EDITED"), history(101, "EDITED")}
	if len(bodies[0]) < arrivingFrom {
		t.Fatalf("the body is %d bytes, under %d", len(bodies[0]), arrivingFrom)
	}
	for i, body := range bodies {
		if resp, b := g.do(t, "POST", "/v1/chat/completions", "", body); resp.StatusCode != 200 {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
		}
		got := g.up.received()
		if last := got[len(got)-1]; !bytes.Equal(last, body) {
			t.Fatalf("request %d: the upstream got %d bytes, not the %d sent", i, len(last), len(body))
		}
	}
}

// readComparing fills the body whatever the reads' sizes, and a body
// shorter than its length is an error, as io.ReadFull's.
func TestReadComparingFillsTheBody(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789"), 10_000)
	for name, r := range map[string]io.Reader{
		"half":     iotest.HalfReader(bytes.NewReader(want)),
		"one byte": iotest.OneByteReader(bytes.NewReader(want)),
		"data+EOF": iotest.DataErrReader(bytes.NewReader(want)),
	} {
		b := make([]byte, len(want))
		copy(b, want[:100])
		if _, err := io.CopyN(io.Discard, r, 100); err != nil {
			t.Fatal(err)
		}
		if err := readComparing(r, b, 100, nil, nil); err != nil || !bytes.Equal(b, want) {
			t.Fatalf("%s: err %v, equal %v", name, err, bytes.Equal(b, want))
		}
	}
	b := make([]byte, len(want)+1)
	if err := readComparing(bytes.NewReader(want), b, 0, nil, nil); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a short body: %v", err)
	}
}
