package gateway

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/upstream"
)

// The engine's compactions are counted by their kind: a session idle past
// microcompaction's threshold clears its older pasted page at its next
// turn, and imgctx_compactions_total says micro.
func TestSessionCompactionsAreCounted(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	now := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	g.engine.Now = func() time.Time { return now }
	id := g.newSession(t, "", `{"model":"gpt-4o"}`)
	raw, _ := samplePNG(t)
	page := func(n int) string {
		return `{"messages":[{"role":"user","content":[{"type":"text","text":"this page"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` +
			base64.StdEncoding.EncodeToString(distinctPNG(raw, n)) + `"}}]}]}`
	}
	var last []byte
	for i, msg := range []string{page(1), page(2), `{"messages":[{"role":"user","content":"back after lunch"}]}`} {
		if i == 2 {
			now = now.Add(2 * time.Hour)
		}
		resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(msg))
		if resp.StatusCode != 200 {
			t.Fatalf("turn %d: %d %s", i+1, resp.StatusCode, body)
		}
		last = body
	}
	if !strings.Contains(string(last), `"compaction":"micro"`) || !strings.Contains(string(last), `"kind":"compacted"`) {
		t.Fatalf("the turn's events do not name the microcompaction: %s", last)
	}
	if m := metric(t, g, "imgctx_compactions_total"); m != `imgctx_compactions_total{kind="micro"} 1` {
		t.Fatalf("compactions counted:\n%s", m)
	}
}
