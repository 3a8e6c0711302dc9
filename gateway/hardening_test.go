package gateway

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
)

// listCounting is a session store that counts List calls.
type listCounting struct {
	session.Store
	lists int
}

func (l *listCounting) List(ctx context.Context, tenant string) ([]session.Meta, error) {
	l.lists++
	return l.Store.List(ctx, tenant)
}

// Regression (issue "Hardening", item 5): /readyz listed every session of
// tenant default; it now pings the store in constant time.
func TestReadyzDoesNotListSessions(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	store := &listCounting{Store: g.engine.Sessions}
	g.engine.Sessions = store
	for range 50 {
		g.engine.NewSession(t.Context(), "default", "gpt-4o", false, "")
	}
	resp, body := g.do(t, "GET", "/readyz", "", nil)
	if resp.StatusCode != 200 || store.lists != 0 {
		t.Fatalf("readyz: %d %s, %d List calls; want 200 and none", resp.StatusCode, body, store.lists)
	}
}

// Regression (items 6 and 11): an absurd model name is refused before it
// reaches routing or logs; an upstream answer over the limit is a 502
// naming it, never a cut body sent as 200.
func TestAbsurdModelAndOversizedAnswer(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	resp, body := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"`+strings.Repeat("m", 5000)+`","messages":[{"role":"user","content":"hi"}]}`))
	if resp.StatusCode != 400 || !strings.Contains(string(body), "the limit is 256") || len(g.up.received()) != 0 {
		t.Fatalf("long model: %d %s", resp.StatusCode, body)
	}
	big := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","choices":[{"message":{"role":"assistant","content":"`+strings.Repeat("x", 4096)+`"}}]}`)
	}))
	defer big.Close()
	g.engine.Upstream.BaseURL = big.URL
	g.server.cfg.MaxResponseBytes = 1024
	resp, body = g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if resp.StatusCode != 502 || !strings.Contains(string(body), "over the limit of 1024 bytes") {
		t.Fatalf("oversized answer: %d %.200s", resp.StatusCode, body)
	}
}

// Regression (item 9): a stored image is served with nosniff.
func TestImagesServedWithNosniff(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	raw, _ := samplePNG(t)
	resp, body := g.do(t, "POST", "/v1/images", "", raw, "Content-Type", "image/png")
	if resp.StatusCode != 201 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	resp, _ = g.do(t, "GET", "/v1/images/sha256-534742a9a0be702e61ca5937b744994707ab2944ffb315b35a959ef1f5173e57", "", nil)
	if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("headers %v", resp.Header)
	}
}

// Regression (item 3): 1,000,000 one-letter messages cost 16 s of CPU and
// 520 MB a request. Messages and parts are capped per request (413 with the
// limit), before the view of them is built past the cap.
func TestMessageAndPartCaps(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	many := `{"model":"gpt-4o","messages":[` + strings.Repeat(`{"role":"user","content":"a"},`, 20_000) + `{"role":"user","content":"a"}]}`
	resp, body := g.do(t, "POST", "/v1/chat/completions", "", []byte(many))
	if resp.StatusCode != 413 || !strings.Contains(string(body), "more than 10000 messages") {
		t.Fatalf("many messages: %d %.200s", resp.StatusCode, body)
	}
	parts := `{"model":"gpt-4o","messages":[{"role":"user","content":[` + strings.Repeat(`{"type":"text","text":"a"},`, 60_000) + `{"type":"text","text":"a"}]}]}`
	resp, body = g.do(t, "POST", "/v1/chat/completions", "", []byte(parts))
	if resp.StatusCode != 413 || !strings.Contains(string(body), "more than 50000 parts") {
		t.Fatalf("many parts: %d %.200s", resp.StatusCode, body)
	}
	if len(g.up.received()) != 0 {
		t.Fatal("an over-limit request reached the upstream")
	}
	g.server.cfg.MaxMessages = 30_000 // configurable
	if resp, body = g.do(t, "POST", "/v1/chat/completions", "", []byte(many)); resp.StatusCode != 200 {
		t.Fatalf("under a raised limit: %d %.200s", resp.StatusCode, body)
	}
}
