package gateway

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire/openai"
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
		g.engine.NewSession(t.Context(), "default", chat.Settings{Model: "gpt-4o"}, "")
	}
	resp, body := g.do(t, "GET", "/readyz", "", nil)
	if resp.StatusCode != 200 || store.lists != 0 {
		t.Fatalf("readyz: %d %s, %d List calls; want 200 and none", resp.StatusCode, body, store.lists)
	}
}

// failingImages is an image store that cannot be reached: every call
// fails as a dial does.
type failingImages struct{ imagestore.Store }

var errDial = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

func (failingImages) Stat(context.Context, string, blob.Ref) (imagestore.Info, error) {
	return imagestore.Info{}, errDial
}

func (failingImages) Put(context.Context, string, blob.Ref, []byte) error { return errDial }

// Issue "Hardening, third pass", item 10: with the image store down (an
// S3 outage), /readyz still answers 200 and says the replica is degraded,
// so a load balancer keeps it; text-only requests are served; a request
// with a new image fails fast with 503 and Retry-After, naming no host.
func TestImageStoreOutageDegradesReadiness(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.engine.Images = failingImages{g.engine.Images}
	resp, body := g.do(t, "GET", "/readyz", "", nil)
	if resp.StatusCode != 200 || !strings.Contains(string(body), "degraded: image store unavailable") || strings.Contains(string(body), "connection refused") {
		t.Fatalf("readyz: %d %s; want 200, degraded, no cause", resp.StatusCode, body)
	}
	resp, body = g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
	if resp.StatusCode != 200 {
		t.Fatalf("a text-only request: %d %s", resp.StatusCode, body)
	}
	_, b64 := samplePNG(t)
	resp, body = g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,`+b64+`"}}]}]}`))
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "image store is unavailable") || strings.Contains(string(body), "refused") {
		t.Fatalf("a request with an image: %d %s", resp.StatusCode, body)
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

// stall opens a connection that sends a request's head and a few bytes of
// a body it promised to be n bytes, then nothing; it returns what the
// gateway answers, once it answers.
func stall(t *testing.T, g *gw, key string, n int) <-chan string {
	conn, err := net.Dial("tcp", strings.TrimPrefix(g.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model", key, n)
	answer := make(chan string, 1)
	go func() {
		b := make([]byte, 4096)
		k, _ := conn.Read(b)
		answer <- string(b[:k])
	}()
	return answer
}

// hi is a small text request that goes straight through.
var hi = []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`)

// alphaStalls has tenant alpha (key ka) stall n bodies and checks that
// tenant beta (kb) is still served meanwhile; it returns what alpha's
// stalled requests are answered.
func alphaStalls(t *testing.T, g *gw, n int) []<-chan string {
	t.Helper()
	var stalled []<-chan string
	for range n {
		stalled = append(stalled, stall(t, g, "ka", 1000))
	}
	time.Sleep(50 * time.Millisecond) // the stalled heads are in
	if resp, body := g.do(t, "POST", "/v1/chat/completions", "kb", hi); resp.StatusCode != 200 {
		t.Fatalf("tenant beta while alpha stalls %d requests: %d %s", n, resp.StatusCode, body)
	}
	return stalled
}

// server.max_concurrent_per_tenant, when set, is one tenant's share in
// place of three quarters: past it that tenant's next request is answered
// 429 at once, and another tenant's still goes through.
func TestAConfiguredTenantShare(t *testing.T) {
	g := newGW(t, upstream.OpenAI, map[string]string{"ka": "alpha", "kb": "beta"})
	g.server.cfg.MaxConcurrent, g.server.cfg.MaxConcurrentPerTenant, g.server.cfg.BodyTimeout, g.server.cfg.MinBodyRate = 8, 2, 300*time.Millisecond, 1<<40
	stalled := alphaStalls(t, g, 3)
	refused := 0
	for _, a := range stalled {
		if strings.HasPrefix(<-a, "HTTP/1.1 429") {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d of alpha's three requests refused, want the one past its share of 2", refused)
	}
}

// Regression (items 1 and 4): connections that promise a large body and
// send 8 bytes held every slot for as long as they liked; tenant B got 429
// the whole time. Now one tenant gets at most three quarters of the slots,
// a body has its deadline (408 past it, the slot free again), and bodies
// in flight are admitted by their bytes.
func TestStalledBodiesDoNotLockOtherTenantsOut(t *testing.T) {
	g := newGW(t, upstream.OpenAI, map[string]string{"ka": "alpha", "kb": "beta"})
	g.server.cfg.MaxConcurrent, g.server.cfg.BodyTimeout, g.server.cfg.MinBodyRate = 8, 300*time.Millisecond, 1<<40
	stalled := alphaStalls(t, g, 8)
	timedOut, refused := 0, 0
	for _, a := range stalled {
		switch got := <-a; {
		case strings.HasPrefix(got, "HTTP/1.1 408"):
			timedOut++
		case strings.HasPrefix(got, "HTTP/1.1 429"):
			refused++
		default:
			t.Fatalf("a stalled request got %.100q", got)
		}
	}
	if timedOut != 6 || refused != 2 {
		t.Fatalf("%d stalled requests timed out, %d refused; want alpha's share (6) timed out and 2 refused", timedOut, refused)
	}
	if resp, body := g.do(t, "POST", "/v1/chat/completions", "ka", hi); resp.StatusCode != 200 {
		t.Fatalf("alpha once its stalled requests are gone: %d %s", resp.StatusCode, body)
	}

	// By bytes: alpha holds 700 KB of its 768 KB share (3/4 of 1 MB); a
	// 100 KB more of alpha's is over its share, 400 KB of beta's over the
	// total.
	g.server.cfg.MaxInflightBytes, g.server.cfg.BodyTimeout = 1<<20, 500*time.Millisecond
	held := stall(t, g, "ka", 700<<10)
	time.Sleep(50 * time.Millisecond)
	sized := func(n int) []byte {
		return []byte(`{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", n) + `"}]}`)
	}
	resp, body := g.do(t, "POST", "/v1/chat/completions", "ka", sized(100<<10))
	if resp.StatusCode != 429 || !strings.Contains(string(body), "bytes of this tenant's request bodies") {
		t.Fatalf("over alpha's share of the bytes: %d %.200s", resp.StatusCode, body)
	}
	resp, body = g.do(t, "POST", "/v1/chat/completions", "kb", sized(400<<10))
	if resp.StatusCode != 429 || !strings.Contains(string(body), "bytes of request bodies in flight") {
		t.Fatalf("over the bytes in flight: %d %.200s", resp.StatusCode, body)
	}
	if resp, _ := g.do(t, "POST", "/v1/chat/completions", "kb", hi); resp.StatusCode != 200 {
		t.Fatalf("a small request beside the held bytes: %d", resp.StatusCode)
	}
	<-held
}

// The body deadline is lifted once the body is in: a streamed answer that
// lasts longer than it is not cut.
func TestBodyDeadlineDoesNotCutALongStream(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	g.server.cfg.BodyTimeout, g.server.cfg.MinBodyRate = 100*time.Millisecond, 1<<40
	g.up.eventGap = 60 * time.Millisecond // seven events: about 400 ms
	resp, body := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if resp.StatusCode != 200 || !strings.Contains(string(body), "[DONE]") || !strings.Contains(string(body), "form.") {
		t.Fatalf("the stream was cut: %d %s", resp.StatusCode, body)
	}
}

// Regression (item 2): 25 valid 6000×6000 PNGs to a model whose rule makes
// imgctx shrink them took a minute of CPU and 1.5 GB. Shrinking is bounded
// per request (413 naming the limit) and only new work is charged: an
// image shrunk before comes from the cache.
func TestShrinkingIsBoundedPerRequest(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	edge := tinyProfile
	edge.Name, edge.Match, edge.Limits = "edge", []string{"edge-*"}, tokens.Limits{MaxEdge: 400}
	g.engine.Profiles, _ = tokens.Default().With(edge)
	g.engine.ShrinkPixelsPerRequest = 2_500_000 // two 1280×800 screenshots, not three
	raw, _ := samplePNG(t)
	request := func(first, n int) []byte { // images first … first+n-1
		var parts []string
		for i := first; i < first+n; i++ {
			parts = append(parts, `{"type":"image_url","image_url":{"url":"data:image/png;base64,`+base64.StdEncoding.EncodeToString(distinctPNG(raw, i))+`"}}`)
		}
		return []byte(`{"model":"edge-1","messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`)
	}
	if resp, body := g.do(t, "POST", "/v1/chat/completions", "", request(0, 2)); resp.StatusCode != 200 {
		t.Fatalf("two images: %d %s", resp.StatusCode, body)
	}
	resp, body := g.do(t, "POST", "/v1/chat/completions", "", request(10, 3))
	if resp.StatusCode != 413 || !strings.Contains(string(body), "more than 2500000 (media.shrink_max_pixels_per_request)") || g.engine.Shrinker.Len() != 2 {
		t.Fatalf("three images: %d %s, %d shrunk; want 413 before any of them is decoded", resp.StatusCode, body, g.engine.Shrinker.Len())
	}
	// The first two were shrunk before and come from the cache: only the
	// third is decoded, and the request fits.
	g.engine.ShrinkPixelsPerRequest = 1_100_000
	if resp, body := g.do(t, "POST", "/v1/chat/completions", "", request(0, 3)); resp.StatusCode != 200 {
		t.Fatalf("three images, two cached: %d %s", resp.StatusCode, body)
	}
}

// A request whose decodes found no memory in time (engine.ErrBusy) is a
// 503 with Retry-After in the route's error shape: the client retries.
func TestBusyDecodingIsARetryable503(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	rec := httptest.NewRecorder()
	g.server.fail(rec, openai.Dialect, fmt.Errorf("shrink: %w", engine.ErrBusy))
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "media.shrink_memory") || !strings.Contains(rec.Body.String(), `"error"`) {
		t.Fatalf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}
