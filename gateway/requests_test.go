package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// loggedGW is a gateway with its request log on, two tenants, and its
// log lines captured.
func loggedGW(t *testing.T, format upstream.Format, cfg Config) (*gw, *syncWriter) {
	lines := &syncWriter{w: &bytes.Buffer{}}
	cfg.RequestLog, cfg.MaxBodyBytes = true, 8<<20
	if cfg.Keys == nil {
		cfg.Keys = map[string]string{"key-a": "alpha", "key-b": "beta"}
	}
	g := newGWWith(t, format, cfg, slog.New(slog.NewJSONHandler(lines, nil)))
	return g, lines
}

// requestsOf reads GET /v1/requests, waiting up to 5 s for want lines
// (a request's line is handed over after its answer is the client's).
func requestsOf(t *testing.T, g *gw, key, query string, want int) []session.Request {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, body := g.do(t, "GET", "/v1/requests"+query, key, nil)
		if resp.StatusCode != 200 {
			t.Fatalf("GET /v1/requests%s: %d %s", query, resp.StatusCode, body)
		}
		var list struct {
			Data []session.Request `json:"data"`
		}
		if err := json.Unmarshal(body, &list); err != nil {
			t.Fatal(err)
		}
		if len(list.Data) >= want || time.Now().After(deadline) {
			return list.Data
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncWriter lets a test read what concurrent handlers log.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// Every response carries the request's id — the client's X-Request-Id
// when it is a plain token, a fresh one otherwise — and so does every log
// line of the request; an upstream's own x-request-id reaches the client
// as it came, and the request log keeps both.
func TestRequestIDs(t *testing.T) {
	g, lines := loggedGW(t, upstream.OpenAI, Config{})
	g.up.header = http.Header{"X-Request-Id": {"req_upstream_42"}}
	_, b64 := samplePNG(t)
	body := chatBody("data:image/png;base64," + b64)

	resp, _ := g.do(t, "POST", "/v1/chat/completions", "key-a", body, "X-Request-Id", "client-7f3a")
	if resp.StatusCode != 200 || resp.Header.Get("X-Imgctx-Request-Id") != "client-7f3a" || resp.Header.Get("X-Request-Id") != "req_upstream_42" {
		t.Fatalf("%d: ours %q, X-Request-Id %q", resp.StatusCode, resp.Header.Get("X-Imgctx-Request-Id"), resp.Header.Get("X-Request-Id"))
	}
	g.up.header = nil
	resp, _ = g.do(t, "POST", "/v1/chat/completions", "key-a", body, "X-Request-Id", "no spaces\tor tabs")
	fresh := resp.Header.Get("X-Request-Id")
	if !strings.HasPrefix(fresh, "req_") || len(fresh) != 36 || resp.Header.Get("X-Imgctx-Request-Id") != fresh {
		t.Fatalf("an unusable client id should get a fresh one: %q / %q", fresh, resp.Header.Get("X-Imgctx-Request-Id"))
	}
	// Refused before any upstream: still an id, and a line saying why.
	resp, _ = g.do(t, "POST", "/v1/chat/completions", "key-a", []byte(`{"model":`), "X-Request-Id", "broken-1")
	if resp.StatusCode != 400 || resp.Header.Get("X-Request-Id") != "broken-1" {
		t.Fatalf("a malformed body: %d, id %q", resp.StatusCode, resp.Header.Get("X-Request-Id"))
	}

	got := requestsOf(t, g, "key-a", "", 3)
	if len(got) != 3 || got[2].ID != "client-7f3a" || got[2].UpstreamID != "req_upstream_42" || got[1].ID != fresh || got[0].ID != "broken-1" {
		t.Fatalf("lines: %+v", got)
	}
	if got[0].Status != 400 || got[0].Error == "" || got[2].Status != 200 || got[2].Error != "" {
		t.Fatalf("statuses and errors: %+v", got)
	}
	if byID := requestsOf(t, g, "key-a", "?id=req_upstream_42", 1); len(byID) != 1 || byID[0].ID != "client-7f3a" {
		t.Fatalf("the upstream's id should find the line: %+v", byID)
	}
	// Each "request" log line carries its request's id.
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSpace(lines.String()), "\n") {
		var rec struct {
			Msg string `json:"msg"`
			ID  string `json:"request_id"`
		}
		json.Unmarshal([]byte(l), &rec)
		if rec.Msg == "request" {
			seen[rec.ID] = true
		}
	}
	for _, id := range []string{"client-7f3a", fresh, "broken-1"} {
		if !seen[id] {
			t.Errorf("no log line of request %s carries its id: %s", id, lines.String())
		}
	}
}

// GET /v1/requests is the caller's tenant's log only, filtered as asked;
// a bad filter is a 400 saying what to write.
func TestRequestLogIsTenantScoped(t *testing.T) {
	g, _ := loggedGW(t, upstream.OpenAI, Config{})
	_, b64 := samplePNG(t)
	body := chatBody("data:image/png;base64," + b64)
	for i, key := range []string{"key-a", "key-a", "key-b"} {
		resp, _ := g.do(t, "POST", "/v1/chat/completions", key, body, "X-Request-Id", "r"+string(rune('0'+i)))
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	a, b := requestsOf(t, g, "key-a", "", 2), requestsOf(t, g, "key-b", "", 1)
	if len(a) != 2 || len(b) != 1 || b[0].ID != "r2" || b[0].Tenant != "beta" {
		t.Fatalf("alpha sees %d lines, beta %d: %+v", len(a), len(b), b)
	}
	if got := requestsOf(t, g, "key-b", "?id=r0", 0); len(got) != 0 {
		t.Fatalf("beta found alpha's request by its id: %+v", got)
	}
	if got := requestsOf(t, g, "key-b", "?conversation="+a[0].Conversation, 0); len(got) != 0 {
		t.Fatalf("beta found alpha's conversation: %+v", got)
	}
	if got := requestsOf(t, g, "key-a", "?limit=1", 1); len(got) != 1 || got[0].ID != "r1" {
		t.Fatalf("limit=1: %+v", got)
	}
	if got := requestsOf(t, g, "key-a", "?model=gpt-4o&since="+time.Now().Add(-time.Hour).Format(time.RFC3339), 2); len(got) != 2 {
		t.Fatalf("model and since: %+v", got)
	}
	if got := requestsOf(t, g, "key-a", "?since="+time.Now().Add(time.Hour).Format(time.RFC3339), 0); len(got) != 0 {
		t.Fatalf("since the future: %+v", got)
	}
	// The line counts the image sent, and the tokens the upstream said.
	if l := a[0]; len(l.Images) != 1 || !l.Images[0].Sent || l.Images[0].Width == 0 || l.Input != 1050 || l.Output != 5 || l.Model != "gpt-4o" || !l.Priced || l.Dollars <= 0 {
		t.Fatalf("line: %+v", l)
	}
	// The metrics say the same, by model profile.
	if m := metric(t, g, "imgctx_tokens_total"); !strings.Contains(m, `imgctx_tokens_total{kind="input",model="gpt-4o"} 3150`) {
		t.Errorf("tokens by model: %s", m)
	}
	if m := metric(t, g, "imgctx_cost_dollars_total"); !strings.Contains(m, `imgctx_cost_dollars_total{model="gpt-4o"}`) {
		t.Errorf("dollars by model: %s", m)
	}
	if m := metric(t, g, "imgctx_upstream_duration_seconds_count"); !strings.Contains(m, `model="gpt-4o",upstream=`) {
		t.Errorf("upstream time by model: %s", m)
	}
	for _, q := range []string{"?since=yesterday", "?limit=-1", "?limit=x"} {
		if resp, body := g.do(t, "GET", "/v1/requests"+q, "key-a", nil); resp.StatusCode != 400 || !strings.Contains(string(body), "invalid_request_error") {
			t.Errorf("%s: %d %s", q, resp.StatusCode, body)
		}
	}
	if resp, _ := g.do(t, "GET", "/v1/requests", "", nil); resp.StatusCode != 401 {
		t.Fatalf("no key: %d", resp.StatusCode)
	}
}

// The gateway trims its log at start (and every minute): lines past the
// retention and past the row bound go, the newest stay.
func TestRequestLogRetention(t *testing.T) {
	g, _ := loggedGW(t, upstream.OpenAI, Config{RequestRetention: time.Hour, RequestMaxRows: 3})
	g.server.Close()
	old := time.Now().Add(-2 * time.Hour)
	var lines []session.Request
	for i := range 6 {
		at := time.Now().Add(time.Duration(i-6) * time.Minute)
		if i < 2 {
			at = old
		}
		lines = append(lines, session.Request{ID: "l" + string(rune('0'+i)), Tenant: "alpha", Time: at, Route: "messages", Status: 200})
	}
	if err := g.engine.Sessions.AppendRequests(t.Context(), lines); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s := New(Config{RequestLog: true, RequestRetention: time.Hour, RequestMaxRows: 3}, g.engine, reg, discardLogger())
	defer s.Close()
	s.reqlog.Flush() // its first trim is done before it takes a line
	got, _ := g.engine.Sessions.ListRequests(t.Context(), session.RequestFilter{Tenant: "alpha"})
	ids := ""
	for _, l := range got {
		ids += l.ID
	}
	if ids != "l5l4l3" {
		t.Fatalf("after the trim: %q, want the newest three (l5l4l3)", ids)
	}
	if n := testutil.ToFloat64(s.metrics.requestLogRows); n != 3 {
		t.Fatalf("imgctx_request_log_rows %v, want 3", n)
	}
}

// A sessions API turn has its line too: the session is its conversation,
// the usage the upstream's, the images its live context sent.
func TestRequestLogHasSessionTurns(t *testing.T) {
	g, _ := loggedGW(t, upstream.OpenAI, Config{})
	g.up.toolCalls = []string{"screenshot"}
	id := g.newSession(t, "key-a", `{"model":"gpt-4o","keep_turn_images":true}`)
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "key-a", []byte(`{"messages":[{"role":"user","content":"Open the login page."}]}`))
	_, b64 := samplePNG(t)
	tool := fmt.Sprintf(`{"messages":[{"role":"tool","tool_call_id":"call_1","content":[{"type":"text","text":"captured"},{"type":"image_url","image_url":{"url":"data:image/png;base64,%s"}}]}]}`, b64)
	if resp, body := g.do(t, "POST", "/v1/sessions/"+id+"/turn", "key-a", []byte(tool)); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	got := requestsOf(t, g, "key-a", "?conversation="+id, 2)
	if len(got) != 2 {
		t.Fatalf("%d lines for 2 turns: %+v", len(got), got)
	}
	last := got[0]
	if last.Route != "sessions_turn" || last.Model != "gpt-4o" || last.Input != 1050 || last.Output != 5 || !last.Priced ||
		len(last.Images) != 1 || !last.Images[0].Sent {
		t.Fatalf("the tool turn's line: %+v", last)
	}
	if other := requestsOf(t, g, "key-b", "?conversation="+id, 0); len(other) != 0 {
		t.Fatalf("another tenant sees the session's lines: %+v", other)
	}
}

// A client's X-Request-Id reaches logs, the request log and a response
// header: it is kept only as a plain token, and anything else gets a
// fresh id of the same plain shape.
func FuzzRequestID(f *testing.F) {
	for _, s := range []string{"", "client-7f3a", "a b", "x\r\nSet-Cookie: y", strings.Repeat("a", 129), "ü", "req_0123456789abcdef01234567"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, client string) {
		id := requestID(client)
		if len(id) == 0 || len(id) > MaxRequestID {
			t.Fatalf("%q → %q", client, id)
		}
		for i := 0; i < len(id); i++ {
			c := id[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:-+=/@", c) >= 0) {
				t.Fatalf("%q → %q: byte %q", client, id, c)
			}
		}
		if id != client && !strings.HasPrefix(id, "req_") {
			t.Fatalf("%q → %q: neither kept nor fresh", client, id)
		}
	})
}

// Fresh ids sort as their times do (the request log's id index then
// grows at its end), and ids made in the same millisecond differ.
func TestFreshRequestIDsSortByTime(t *testing.T) {
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	var prev string
	for i := range 2000 {
		id := newRequestID(at.Add(time.Duration(i/4) * time.Millisecond))
		if len(id) != len("req_")+32 {
			t.Fatalf("%q: want req_ and 32 hex digits", id)
		}
		if i%4 == 0 && id <= prev {
			t.Fatalf("%q made a millisecond after %q sorts before it", id, prev)
		}
		if id == prev {
			t.Fatalf("%q made twice", id)
		}
		prev = id
	}
	if got, want := newRequestID(at)[4:16], fmt.Sprintf("%012x", at.UnixMilli()); got != want {
		t.Fatalf("time prefix %s, want %s", got, want)
	}
}

// stalledLog is a session store whose request log stalls until released.
type stalledLog struct {
	*session.Mem
	entered chan struct{} // one send per AppendRequests call, before it waits
	release chan struct{}
	mu      sync.Mutex
	got     int
}

func (s *stalledLog) AppendRequests(ctx context.Context, rs []session.Request) error {
	s.entered <- struct{}{}
	<-s.release
	s.mu.Lock()
	s.got += len(rs)
	s.mu.Unlock()
	return s.Mem.AppendRequests(ctx, rs)
}

// A stalled store holds no request up: the lines queued past the queue's
// bound are dropped and counted, and every other line is written once the
// store answers again.
func TestRequestLogDropsPastItsBoundWhileTheStoreStalls(t *testing.T) {
	store := &stalledLog{Mem: &session.Mem{}, entered: make(chan struct{}), release: make(chan struct{})}
	m := NewMetrics(prometheus.NewRegistry())
	l := newRequestLog(store, time.Hour, 0, slog.New(slog.DiscardHandler), m)
	line := func(i int) session.Request {
		return session.Request{Tenant: "t", ID: fmt.Sprintf("r%d", i), Time: time.Now()}
	}
	l.add(line(0))
	<-store.entered // the writer took that line and waits on the store
	const over = 5
	for i := range requestLogQueue + over {
		l.add(line(i + 1)) // returns at once: the store stalls the writer, not the request
	}
	if got := testutil.ToFloat64(m.requestLogDropped); got != over {
		t.Fatalf("dropped %v lines, want %d", got, over)
	}
	go func() {
		for range store.entered {
		}
	}()
	close(store.release)
	l.Flush()
	l.Close()
	close(store.entered)
	if want := 1 + requestLogQueue; store.got != want {
		t.Fatalf("the store got %d lines, want %d", store.got, want)
	}
}

// refusingLog is a session store whose request log refuses its first
// batches and every trim.
type refusingLog struct {
	*session.Mem
	refuse atomic.Int64 // batches still to refuse
}

func (s *refusingLog) AppendRequests(ctx context.Context, rs []session.Request) error {
	if s.refuse.Add(-1) >= 0 {
		return errors.New("disk full")
	}
	return s.Mem.AppendRequests(ctx, rs)
}

func (s *refusingLog) TrimRequests(context.Context, time.Time, int) (int, error) {
	return 0, errors.New("database is locked")
}

// Lines the store refuses are not lost silently: they are counted as
// dropped and the log says how many and why; the next batch is written
// as usual. A trim the store refuses is logged, and the log goes on.
func TestRequestLogCountsWhatTheStoreRefuses(t *testing.T) {
	store := &refusingLog{Mem: &session.Mem{}}
	store.refuse.Store(1)
	m := NewMetrics(prometheus.NewRegistry())
	logged := &syncWriter{w: &bytes.Buffer{}}
	l := newRequestLog(store, time.Hour, 0, slog.New(slog.NewJSONHandler(logged, nil)), m)
	defer l.Close()
	for i := range 3 {
		l.add(session.Request{Tenant: "t", ID: fmt.Sprintf("r%d", i), Time: time.Now()})
	}
	l.Flush()
	if got := testutil.ToFloat64(m.requestLogDropped); got != 3 {
		t.Fatalf("dropped %v lines, want the 3 of the refused batch", got)
	}
	l.add(session.Request{Tenant: "t", ID: "r3", Time: time.Now()})
	l.Flush()
	rs, err := store.ListRequests(t.Context(), session.RequestFilter{Tenant: "t"})
	if err != nil || len(rs) != 1 || rs[0].ID != "r3" {
		t.Fatalf("after the refusal the store holds %+v (%v); want r3 alone", rs, err)
	}
	out := logged.String()
	if !strings.Contains(out, `"msg":"request log: lines not written","lines":3,"err":"disk full"`) || !strings.Contains(out, `"msg":"request log: trimming","err":"database is locked"`) {
		t.Fatalf("the log says:\n%s", out)
	}
}
