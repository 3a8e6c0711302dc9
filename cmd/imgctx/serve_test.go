package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/internal/config"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
)

// lineWriter hands the first line matching re to found.
type lineWriter struct {
	mu    sync.Mutex
	buf   strings.Builder
	re    *regexp.Regexp
	found chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if m := w.re.FindStringSubmatch(w.buf.String()); m != nil && w.found != nil {
		w.found <- m[1]
		w.found = nil
	}
	return len(p), nil
}

// startServe runs serve on a config over up and returns its base URL and
// a stop that cancels it and returns what serve returned.
func startServe(t *testing.T, up, dataDir string) (base string, stop func() error) {
	return startServeFile(t, "", map[string]any{"data_dir": dataDir, "upstream.base_url": up})
}

// startServeFile is startServe on a config file (none: "") and keys
// set over it.
func startServeFile(t *testing.T, file string, set map[string]any) (base string, stop func() error) {
	t.Helper()
	set["server.addr"], set["log.level"] = "127.0.0.1:0", "error"
	cfg, err := config.Load(file, func(string) (string, bool) { return "", false }, set)
	if err != nil {
		t.Fatal(err)
	}
	// The channel is kept here: the writer clears its own field under its lock.
	found := make(chan string, 1)
	out := &lineWriter{re: regexp.MustCompile(`listening on (http://\S+)`), found: found}
	a := &app{stdout: out, stderr: io.Discard, cfg: cfg, log: newLogger(io.Discard, cfg.Log)}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- a.serve(ctx) }()
	select {
	case base = <-found:
	case err := <-served:
		t.Fatalf("serve ended: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start")
	}
	return base, func() error { cancel(); return <-served }
}

// A stop signal while a request is in flight: the request finishes, then
// serve returns cleanly.
func TestServeShutsDownGracefully(t *testing.T) {
	arrived := make(chan struct{}, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		arrived <- struct{}{}
		time.Sleep(400 * time.Millisecond) // in flight when the stop comes
		io.WriteString(w, completionDone)
	}))
	defer up.Close()
	base, stop := startServe(t, up.URL, t.TempDir())
	result := make(chan string, 1)
	go func() {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`))
		if err != nil {
			result <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		result <- string(b)
	}()
	<-arrived // the request is in flight at the upstream: now stop
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	if got := <-result; !strings.Contains(got, `"content":"done"`) {
		t.Fatalf("the in-flight request did not finish: %s", got)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("serve: %v", err)
	}
	if _, err := http.Get(base + "/healthz"); err == nil {
		t.Fatal("still serving after shutdown")
	}
}

const completionDone = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1}}`

// A request that decides nothing leaves its conversation's measurement
// base and activity time to the flush serve runs every second; stopped
// before the next tick, serve still writes them (every's last run).
func TestServeWritesWhatRequestsLeftForLaterAtShutdown(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, completionDone)
	}))
	defer up.Close()
	dir := t.TempDir()
	base, stop := startServe(t, up.URL, dir)
	opening := `{"model":"gpt-4o","messages":[{"role":"user","content":"look at the page"}]}`
	// The same turn a tool step later: no image, no new human message.
	step := `{"model":"gpt-4o","messages":[{"role":"user","content":"look at the page"},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"look","arguments":"{}"}}]},` +
		`{"role":"tool","tool_call_id":"c1","content":"an empty page"}]}`
	for _, body := range []string{opening, step} {
		resp, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	store, err := sqlite.Open(filepath.Join(dir, "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	sp, err := openai.Scan([]byte(step), wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := store.LoadProxied(context.Background(), "default", engine.ConversationKey("default", openai.Dialect, http.Header{}, sp))
	if err != nil {
		t.Fatal(err)
	}
	if p.Messages != 3 {
		t.Fatalf("the stored conversation ends at its first request (%d messages): the second's base was lost at shutdown", p.Messages)
	}
}

// every runs its function on each tick and once more when stopped, and
// stop returns once that last run has ended.
func TestEveryRunsOnceMoreWhenStopped(t *testing.T) {
	var mu sync.Mutex
	runs, ended := 0, false
	stop := every(time.Hour, func() {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		runs, ended = runs+1, true
		mu.Unlock()
	})
	stop()
	mu.Lock()
	defer mu.Unlock()
	if runs != 1 || !ended {
		t.Fatalf("%d runs before stop returned, want the last one", runs)
	}
}

// Regression (issue "Hardening", item 9): a password in an upstream URL
// never reaches the start-up log.
func TestUpstreamPasswordIsRedacted(t *testing.T) {
	if got := redact("https://user:s3cret@proxy.example:8443/base"); strings.Contains(got, "s3cret") || !strings.Contains(got, "proxy.example:8443") {
		t.Fatalf("redact: %s", got)
	}
	if got := redact("http://127.0.0.1:11434"); got != "http://127.0.0.1:11434" {
		t.Fatalf("redact changed a URL without a password: %s", got)
	}
}

// serve sweeps idle proxied conversations from the start.
func TestServeExpiresIdleProxiedConversations(t *testing.T) {
	s := &session.Mem{}
	ctx := context.Background()
	s.SaveProxied(ctx, "default", "old", session.Proxied{})
	stop := expireProxied(s, time.Nanosecond, slog.New(slog.DiscardHandler), func(context.Context) {})
	defer stop()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := s.LoadProxied(ctx, "default", "old"); err != nil {
			return // swept
		}
		if time.Now().After(deadline) {
			t.Fatal("an idle proxied conversation was never swept")
		}
		time.Sleep(time.Millisecond)
	}
}

// blockingExpiry is a session store whose expiry pass holds until its
// context ends.
type blockingExpiry struct {
	*session.Mem
	entered chan struct{}
	passes  atomic.Int32
}

func (s *blockingExpiry) ExpireProxied(ctx context.Context, _ time.Time) (int, error) {
	s.passes.Add(1)
	s.entered <- struct{}{}
	<-ctx.Done()
	return 0, ctx.Err()
}

// The expiry's stop ends the pass under way and returns once it has
// ended, so the store is never used after serve closes it; a pass cut
// short is not logged as an error.
func TestExpiryStopsBeforeTheStoreCloses(t *testing.T) {
	s := &blockingExpiry{Mem: &session.Mem{}, entered: make(chan struct{}, 1)}
	var logged bytes.Buffer
	swept := make(chan error, 1)
	stop := expireProxied(s, time.Nanosecond, slog.New(slog.NewTextHandler(&logged, nil)), func(ctx context.Context) { swept <- ctx.Err() })
	<-s.entered // a pass holds the store
	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("the stop did not end the pass under way")
	}
	select {
	case err := <-swept:
		if err == nil {
			t.Fatal("the sweep after a stopped pass ran with a live context")
		}
	default:
		t.Fatal("the stop returned before the pass under way had ended")
	}
	n := s.passes.Load()
	time.Sleep(20 * time.Millisecond)
	if s.passes.Load() != n || n != 1 || logged.Len() != 0 {
		t.Fatalf("after the stop: %d passes (was %d), logged %q", s.passes.Load(), n, logged.String())
	}
}

// With no upstream.base_url the sessions API runs on the first listed
// upstream it can speak to (docs/config.md, upstreams): a Gemini entry
// first is passed over, the Anthropic one after it takes the turn.
func TestSessionsRunOnTheFirstUpstreamTheyCanSpeakTo(t *testing.T) {
	var mu sync.Mutex
	hits := map[string][]string{}
	fake := func(name, answer string) *httptest.Server {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			mu.Lock()
			hits[name] = append(hits[name], r.URL.Path)
			mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, answer)
		}))
		t.Cleanup(s.Close)
		return s
	}
	gemini := fake("gemini", `{"candidates":[]}`)
	claude := fake("claude", `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"done"}],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":1}}`)
	cfg := writeTemp(t, "c.yaml", fmt.Appendf(nil, "upstreams:\n  - name: gemini\n    format: gemini\n    base_url: %s\n  - name: claude\n    format: anthropic\n    base_url: %s\n", gemini.URL, claude.URL))
	base, stop := startServeFile(t, cfg, map[string]any{"data_dir": t.TempDir()})
	defer stop()
	resp, err := http.Post(base+"/v1/sessions", "application/json", strings.NewReader(`{"model":"claude-sonnet-4-6"}`))
	if err != nil {
		t.Fatal(err)
	}
	var s struct{ ID string }
	json.NewDecoder(resp.Body).Decode(&s)
	resp.Body.Close()
	resp, err = http.Post(base+"/v1/sessions/"+s.ID+"/turn", "application/json", strings.NewReader(`{"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != 200 || !strings.Contains(string(b), "done") || len(hits["claude"]) != 1 || hits["claude"][0] != "/v1/messages" || len(hits["gemini"]) != 0 {
		t.Fatalf("turn: %d %s; upstreams reached: %v", resp.StatusCode, b, hits)
	}
}

// A second serve on a taken address says so and how to choose another,
// and exits 1 (its store opened and closed again, nothing left behind).
func TestServeOnATakenAddressSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	r := imgctx(t, "serve", "--addr", ln.Addr().String(), "--data-dir", t.TempDir())
	if r.code != 1 || !strings.Contains(r.stderr, "is another imgctx or program on "+ln.Addr().String()+"? choose another with --addr") {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
}
