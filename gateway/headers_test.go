package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
)

// recorder is an upstream that records the last request's headers and
// query, and answers with the headers providers send (request ids, rate
// limits), as JSON, as a stream, or as an error.
type recorder struct {
	srv *httptest.Server
	mu  sync.Mutex
	hdr http.Header
	url string
	// answer: "json", "sse", "json-to-stream" (JSON even when a stream was
	// asked for), "error".
	answer string
}

func newRecorder(t *testing.T, answer string) *recorder {
	rec := &recorder{answer: answer}
	rec.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		rec.mu.Lock()
		rec.hdr, rec.url = r.Header.Clone(), r.URL.String()
		rec.mu.Unlock()
		h := w.Header()
		h.Set("request-id", "req_011CSHoEeqs5C35K2UUqR7Fy")
		h.Set("x-request-id", "req_abc")
		h.Set("anthropic-ratelimit-requests-remaining", "49")
		h.Set("x-ratelimit-remaining-tokens", "29000")
		h.Set("retry-after", "3")
		switch rec.answer {
		case "sse":
			h.Set("Content-Type", "text/event-stream")
			io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n")
			io.WriteString(w, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		case "error":
			h.Set("Content-Type", "application/json")
			w.WriteHeader(529)
			io.WriteString(w, `{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"},"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"}`)
		default: // json, json-to-stream
			h.Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":1}}`)
		}
	}))
	t.Cleanup(rec.srv.Close)
	return rec
}

func (r *recorder) last() (http.Header, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.hdr, r.url
}

// Every client header reaches the upstream but hop-by-hop ones and the
// gateway's own credentials; the query goes too; the upstream's request id,
// rate-limit and retry-after headers come back, plain and streamed; an
// upstream error comes back with its status, headers and body unchanged; a
// stream request answered with JSON gets that JSON.
func TestHeaderMatrix(t *testing.T) {
	sent := map[string]string{
		"anthropic-beta":           "context-management-2025-06-27,interleaved-thinking-2025-05-14",
		"anthropic-version":        "2023-06-01",
		"User-Agent":               "claude-cli/2.1.0 (external, cli)",
		"X-Stainless-Lang":         "js",
		"X-Stainless-Retry-Count":  "0",
		"OpenAI-Organization":      "org-123",
		"OpenAI-Project":           "proj_456",
		"X-Claude-Code-Session-Id": "0f8e1c2d-session",
		"Session-Id":               "codex-session-1",
		"X-Session-Id":             "ses_opencode1",
		"traceparent":              "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	hopByHopSent := map[string]string{"Connection": "keep-alive, X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5",
		"X-Imgctx-Session": "s1", "X-Upstream-Api-Key": "sk-client"}
	back := []string{"request-id", "x-request-id", "anthropic-ratelimit-requests-remaining", "x-ratelimit-remaining-tokens", "retry-after"}
	for _, answer := range []string{"json", "sse", "error", "json-to-stream"} {
		t.Run(answer, func(t *testing.T) {
			rec := newRecorder(t, answer)
			g := newGW(t, upstream.Anthropic, map[string]string{"gw-key": "acme"})
			g.engine.Upstream.BaseURL, g.engine.Upstream.APIKey = rec.srv.URL, ""
			var hdr []string
			for k, v := range sent {
				hdr = append(hdr, k, v)
			}
			for k, v := range hopByHopSent {
				hdr = append(hdr, k, v)
			}
			stream := answer != "json"
			body := `{"model":"claude-sonnet-4-6","max_tokens":10,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `,"messages":[{"role":"user","content":"hi"}]}`
			req, _ := http.NewRequestWithContext(t.Context(), "POST", g.srv.URL+"/v1/messages?beta=true", strings.NewReader(body))
			req.Header.Set("x-api-key", "gw-key")
			for i := 0; i < len(hdr); i += 2 {
				req.Header.Set(hdr[i], hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()

			up, url := rec.last()
			for k, v := range sent {
				if up.Get(k) != v {
					t.Errorf("upstream header %s = %q; want %q", k, up.Get(k), v)
				}
			}
			for _, k := range []string{"X-Hop", "Keep-Alive", "X-Imgctx-Session", "X-Upstream-Api-Key", "X-Api-Key", "Authorization"} {
				if up.Get(k) != "" {
					t.Errorf("upstream got %s = %q; it must not", k, up.Get(k))
				}
			}
			if url != "/v1/messages?beta=true" {
				t.Errorf("upstream URL %q; want the query forwarded", url)
			}
			for _, k := range back {
				if resp.Header.Get(k) == "" {
					t.Errorf("response header %s did not reach the client", k)
				}
			}
			switch answer {
			case "error":
				if resp.StatusCode != 529 || !strings.Contains(string(got), `"request_id":"req_011CSHoEeqs5C35K2UUqR7Fy"`) {
					t.Errorf("error: %d %s; want the upstream's 529 and body unchanged", resp.StatusCode, got)
				}
				fallthrough
			case "json-to-stream", "json":
				if answer != "error" && (resp.StatusCode != 200 || !strings.Contains(string(got), `"text":"hi"`) || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json")) {
					t.Errorf("JSON answer: %d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
				}
				// A whole answer goes with its length, not in chunks.
				if resp.ContentLength != int64(len(got)) || len(resp.TransferEncoding) != 0 {
					t.Errorf("a whole answer of %d bytes came with Content-Length %d, Transfer-Encoding %v", len(got), resp.ContentLength, resp.TransferEncoding)
				}
			case "sse":
				if !strings.Contains(string(got), "event: message_stop") {
					t.Errorf("stream: %s", got)
				}
			}
		})
	}
}

// Credentials, in the documented modes: with no gateway keys and no
// upstream key, the client's own key goes upstream unchanged; a configured
// upstream key replaces it; with gateway keys, the gateway key never goes
// upstream and a tenant's upstream key (or the configured one) does.
func TestCredentialModes(t *testing.T) {
	cases := []struct {
		name        string
		keys        map[string]string
		upKey       string
		tenantKeys  map[string]string
		clientAuth  [2]string
		wantAuth    string
		wantXAPIKey string
		format      upstream.Format
	}{
		{"openai client key through", nil, "", nil, [2]string{"Authorization", "Bearer sk-user"}, "Bearer sk-user", "", upstream.OpenAI},
		{"anthropic client key through", nil, "", nil, [2]string{"x-api-key", "sk-ant-user"}, "", "sk-ant-user", upstream.Anthropic},
		{"configured key replaces", nil, "sk-conf", nil, [2]string{"Authorization", "Bearer sk-user"}, "Bearer sk-conf", "", upstream.OpenAI},
		{"gateway key stays, configured key goes", map[string]string{"gw": "acme"}, "sk-conf", nil, [2]string{"Authorization", "Bearer gw"}, "Bearer sk-conf", "", upstream.OpenAI},
		{"gateway key stays, tenant key goes", map[string]string{"gw": "acme"}, "sk-conf", map[string]string{"acme": "sk-acme"}, [2]string{"x-api-key", "gw"}, "", "sk-acme", upstream.Anthropic},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rec := newRecorder(t, "json")
			g := newGW(t, c.format, c.keys)
			g.engine.Upstream.BaseURL, g.engine.Upstream.APIKey = rec.srv.URL, c.upKey
			g.server.cfg.UpstreamKeys = c.tenantKeys
			path, body := "/v1/chat/completions", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`
			if c.format == upstream.Anthropic {
				path, body = "/v1/messages", `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
			}
			resp, answer := g.do(t, "POST", path, "", []byte(body), c.clientAuth[0], c.clientAuth[1])
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, answer)
			}
			up, _ := rec.last()
			if up.Get("Authorization") != c.wantAuth || up.Get("X-Api-Key") != c.wantXAPIKey {
				t.Fatalf("upstream got Authorization %q, x-api-key %q; want %q, %q", up.Get("Authorization"), up.Get("X-Api-Key"), c.wantAuth, c.wantXAPIKey)
			}
		})
	}
}

// slowSaves is a session store whose writes of a proxied conversation's
// decisions wait until the test lets them go.
type slowSaves struct {
	session.Store
	entered chan struct{}
	release chan struct{}
	saved   atomic.Int32
}

func (s *slowSaves) SaveProxied(ctx context.Context, tenant, key string, p session.Proxied) error {
	s.entered <- struct{}{}
	<-s.release
	err := s.Store.SaveProxied(ctx, tenant, key, p)
	s.saved.Add(1)
	return err
}

// An answer is the client's before the conversation's decisions are
// persisted: the client reads it to its end — a whole answer to its
// length, a stream to the end of its chunks — while the write still waits.
func TestTheAnswerIsTheClientsBeforeTheDecisionsArePersisted(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			g := newGW(t, upstream.OpenAI, nil)
			slow := &slowSaves{Store: g.engine.Sessions, entered: make(chan struct{}, 8), release: make(chan struct{})}
			g.engine.Sessions = slow
			released := false
			let := func() {
				if !released {
					close(slow.release)
					released = true
				}
			}
			t.Cleanup(let)
			shot := screenshots(1, 64)[0]
			body := imageRequest([]string{"data:image/png;base64," + base64.StdEncoding.EncodeToString(shot)})
			want := `"choices"`
			if stream {
				body = bytes.Replace(body, []byte(`{"messages"`), []byte(`{"stream":true,"messages"`), 1)
				want = `"finish_reason":"stop"`
			}

			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", g.srv.URL+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 || !bytes.Contains(got, []byte(want)) {
				t.Fatalf("the answer did not come whole while its decisions waited: %d %v %s", resp.StatusCode, err, got)
			}
			select {
			case <-slow.entered:
			case <-time.After(5 * time.Second):
				t.Fatal("the request's decisions were never persisted: nothing was waiting")
			}
			// Shutting down waits for the write behind the answer.
			closed := make(chan struct{})
			go func() { g.server.Close(); close(closed) }()
			select {
			case <-closed:
				t.Fatal("Close returned while the decisions were still being written")
			case <-time.After(50 * time.Millisecond):
			}
			let()
			select {
			case <-closed:
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not return once the write was let go")
			}
			if slow.saved.Load() != 1 {
				t.Fatalf("%d writes done when Close returned, want 1", slow.saved.Load())
			}
		})
	}
}
