package upstream

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/wire"
)

// script answers each attempt with the next status (and header).
func script(t *testing.T, statuses ...int) (*httptest.Server, *atomic.Int32, *[]http.Header) {
	var n atomic.Int32
	var seen []http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := int(n.Add(1)) - 1
		seen = append(seen, r.Header.Clone())
		st := statuses[min(i, len(statuses)-1)]
		switch st {
		case 200:
			io.WriteString(w, `{"ok":true}`)
		case 429:
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(429)
			io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}`)
		default:
			w.WriteHeader(st)
			io.WriteString(w, `{"error":{"message":"status `+http.StatusText(st)+`","type":"x"}}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &n, &seen
}

func recordSleeps(waits *[]time.Duration) func(context.Context, time.Duration) error {
	return func(_ context.Context, d time.Duration) error { *waits = append(*waits, d); return nil }
}

func TestRetriesHonourRetryAfter(t *testing.T) {
	srv, n, _ := script(t, 429, 503, 200)
	var waits []time.Duration
	c := &Client{Format: OpenAI, BaseURL: srv.URL, Sleep: recordSleeps(&waits)}
	resp, err := c.Do(context.Background(), []byte(`{}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n.Load() != 3 || len(waits) != 2 || waits[0] != 3*time.Second {
		t.Fatalf("%d attempts, waits %v; want 3 attempts, the first wait 3s (Retry-After)", n.Load(), waits)
	}
}

func TestNeverRetriesA4xx(t *testing.T) {
	for _, st := range []int{400, 401, 404, 413} {
		srv, n, _ := script(t, st, 200)
		var waits []time.Duration
		c := &Client{Format: OpenAI, BaseURL: srv.URL, Sleep: recordSleeps(&waits)}
		_, err := c.Do(context.Background(), []byte(`{}`), nil)
		var we *wire.Error
		if !errors.As(err, &we) || we.Status != st || n.Load() != 1 {
			t.Fatalf("%d: %v after %d attempts", st, err, n.Load())
		}
	}
}

func TestGivesUpAfterMaxRetries(t *testing.T) {
	srv, n, _ := script(t, 500)
	var waits []time.Duration
	c := &Client{Format: Anthropic, BaseURL: srv.URL, MaxRetries: 3, Sleep: recordSleeps(&waits)}
	_, err := c.Do(context.Background(), []byte(`{}`), nil)
	var we *wire.Error
	if !errors.As(err, &we) || we.Kind != wire.Server || n.Load() != 4 {
		t.Fatalf("%v after %d attempts", err, n.Load())
	}
	for i := 1; i < len(waits); i++ {
		if waits[i] > 8*time.Second {
			t.Fatalf("backoff %v over the cap", waits[i])
		}
	}
}

func TestHeadersPerFormat(t *testing.T) {
	srv, _, seen := script(t, 200)
	(&Client{Format: Anthropic, BaseURL: srv.URL, APIKey: "sk-ant"}).Do(context.Background(), []byte(`{}`), nil)
	(&Client{Format: OpenAI, BaseURL: srv.URL + "/", APIKey: "sk-oai"}).Do(context.Background(), []byte(`{}`), http.Header{"X-Trace": {"t1"}})
	h := *seen
	if h[0].Get("x-api-key") != "sk-ant" || h[0].Get("anthropic-version") == "" || h[1].Get("Authorization") != "Bearer sk-oai" || h[1].Get("X-Trace") != "t1" {
		t.Fatalf("headers %v", h)
	}
}

func TestCancelledContextStopsRetrying(t *testing.T) {
	srv, n, _ := script(t, 503)
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{Format: OpenAI, BaseURL: srv.URL, Sleep: func(ctx context.Context, d time.Duration) error { cancel(); return ctx.Err() }}
	if _, err := c.Do(ctx, []byte(`{}`), nil); !errors.Is(err, context.Canceled) || n.Load() != 1 {
		t.Fatalf("%v after %d attempts", err, n.Load())
	}
}

// The wait between attempts (a Retry-After of up to a minute) ends when
// the client goes away: a default client waiting on a 429 returns its
// context's error, not after the wait.
func TestRetryWaitEndsWithTheClient(t *testing.T) {
	var n atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Retry-After", "3600") // a minute, at most, of waiting
		w.WriteHeader(429)
		io.WriteString(w, `{"error":{"message":"slow down","type":"rate_limit_error"}}`)
		cancel() // the client goes away while imgctx would wait
	}))
	t.Cleanup(srv.Close)
	c := &Client{Format: OpenAI, BaseURL: srv.URL}
	if _, err := c.Do(ctx, []byte(`{}`), nil); !errors.Is(err, context.Canceled) || n.Load() != 1 {
		t.Fatalf("%v after %d attempts; want context.Canceled after one", err, n.Load())
	}
	if err := sleep(ctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("a wait on a cancelled context: %v", err)
	}
}

// A Files API call carries the request's credentials and nothing else of
// the client's (not its other headers), and a configured key replaces the
// client's; the fingerprint tells credentials apart without holding them.
func TestFileCallSendsOnlyTheCredentials(t *testing.T) {
	var got http.Header
	var query string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, query = r.Header.Clone(), r.URL.RawQuery
		io.WriteString(w, `{}`)
	}))
	defer srv.Close()
	client := &Client{Format: Gemini, BaseURL: srv.URL}
	req := Request{Header: http.Header{"X-Goog-Api-Key": {"AIza-one"}, "X-Secret-Of-The-Client": {"no"}, "User-Agent": {"gemini-cli"}}, Query: "key=AIza-q&alt=sse"}
	call := client.FileCall(req)
	req.Header.Set("X-Goog-Api-Key", "changed after") // the call holds its own copy
	if _, _, _, err := call(t.Context(), wire.FileRequest{Method: http.MethodPost, Path: "/upload/v1beta/files", ContentType: "application/json", Body: []byte(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if got.Get("X-Goog-Api-Key") != "AIza-one" || got.Get("X-Secret-Of-The-Client") != "" || query != "key=AIza-q" {
		t.Fatalf("headers %v, query %q", got, query)
	}
	client.APIKey = "configured"
	if _, _, _, err := client.FileCall(req)(t.Context(), wire.FileRequest{Method: http.MethodDelete, Path: "/v1beta/files/x"}); err != nil {
		t.Fatal(err)
	}
	if got.Get("X-Goog-Api-Key") != "configured" || query != "" {
		t.Fatalf("a configured key: headers %v, query %q", got, query)
	}
	// With a configured key, whatever the client sent, the credential is that key.
	if client.Credential(Request{Header: http.Header{"X-Api-Key": {"one"}}}) != client.Credential(Request{}) {
		t.Fatal("a configured key is not the credential")
	}
	client.APIKey = ""
	a := client.Fingerprint(client.Credential(Request{Header: http.Header{"X-Api-Key": {"one"}}}))
	b := client.Fingerprint(client.Credential(Request{Header: http.Header{"X-Api-Key": {"two"}}}))
	if a == b || len(a) != 32 || client.Credential(Request{}) != "" {
		t.Fatalf("fingerprints %q %q", a, b)
	}
}
