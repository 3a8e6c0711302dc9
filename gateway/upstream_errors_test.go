package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/upstream"
)

// Upstream answers reach the client in the provider's own shape: a 429
// with its Retry-After, a timeout as 504; a client's own key is forwarded
// when allowed.
func TestUpstreamAnswersAndKeys(t *testing.T) {
	var gotAuth string
	slow := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		b, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(b), "busy"):
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"message":"Rate limit reached","type":"requests","code":"rate_limit_exceeded"}}`)
		case strings.Contains(string(b), "slow"):
			<-slow
		default:
			io.WriteString(w, completion)
		}
	}))
	defer up.Close()
	defer close(slow)
	g := newGW(t, upstream.OpenAI, nil)
	g.engine.Upstream.BaseURL = up.URL
	g.server.cfg.PassClientKey = true

	resp, body := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"busy"}]}`))
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" || !strings.Contains(string(body), "rate_limit_exceeded") {
		t.Fatalf("429: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	resp, _ = g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`), "X-Upstream-Api-Key", "sk-client")
	if resp.StatusCode != 200 || gotAuth != "Bearer sk-client" {
		t.Fatalf("client key: %d %q", resp.StatusCode, gotAuth)
	}
	g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if gotAuth != "Bearer upstream-key" {
		t.Fatalf("without a client key the configured one must be sent: %q", gotAuth)
	}
	g.server.cfg.RequestTimeout = 100 * time.Millisecond
	resp, body = g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"slow"}]}`))
	if resp.StatusCode != 504 || !strings.Contains(string(body), "timeout") {
		t.Fatalf("timeout: %d %s", resp.StatusCode, body)
	}
}
