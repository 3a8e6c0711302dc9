package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
)

// fakeUpstream records what it receives and answers in its format: a
// completion, a stream (when asked), a tool call when scripted, or
// prompt-too-long above maxImages images.
type fakeUpstream struct {
	format    upstream.Format
	srv       *httptest.Server
	mu        sync.Mutex
	bodies    [][]byte
	maxImages int      // >0: prompt-too-long above this many images
	toolCalls []string // scripted: answer the next requests with these tool calls
	eventGap  time.Duration
	cancelled chan struct{} // closed when a streaming client went away
	// gate, when set, holds the stream after its first event until the test
	// closes it (or 5 s pass, which gateTimedOut records).
	gate         chan struct{}
	gateTimedOut bool
	// header is set on every answer (an upstream's own request id, say).
	header  http.Header
	parents []string // the traceparent of each request received
}

func (f *fakeUpstream) traceparents() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.parents...)
}

func newFake(t *testing.T, format upstream.Format) *fakeUpstream {
	f := &fakeUpstream{format: format, cancelled: make(chan struct{}, 16)}
	f.srv = httptest.NewServer(http.HandlerFunc(f.handle))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeUpstream) received() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

func countImages(body []byte) int {
	return bytes.Count(body, []byte(`"type":"image_url"`)) + bytes.Count(body, []byte(`"type":"image"`))
}

func (f *fakeUpstream) handle(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // not a request: its body never came whole (an abandoned upstream.Early)
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	if tp := r.Header.Get("Traceparent"); tp != "" {
		f.parents = append(f.parents, tp)
	}
	tool := ""
	if len(f.toolCalls) > 0 {
		tool, f.toolCalls = f.toolCalls[0], f.toolCalls[1:]
	}
	f.mu.Unlock()
	for k, v := range f.header {
		w.Header()[k] = v
	}
	if f.maxImages > 0 && countImages(body) > f.maxImages {
		w.WriteHeader(400)
		if f.format == upstream.Anthropic {
			io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 250000 tokens > 200000 maximum"}}`)
		} else {
			io.WriteString(w, `{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`)
		}
		return
	}
	var top struct {
		Stream bool `json:"stream"`
	}
	_ = json.Unmarshal(body, &top)
	stream := top.Stream
	w.Header().Set("Content-Type", "application/json")
	switch {
	case f.format == upstream.Anthropic && stream:
		w.Header().Set("Content-Type", "text/event-stream")
		events := []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","content":[],"model":"claude-sonnet-4-6","usage":{"input_tokens":30,"cache_read_input_tokens":1000,"cache_creation_input_tokens":0,"output_tokens":1}}}`,
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"A login "}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"form."}}`,
			`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
		}
		f.stream(w, r, events)
	case f.format == upstream.Anthropic:
		content := `[{"type":"text","text":"A login form."}]`
		stop := "end_turn"
		if tool != "" {
			content = `[{"type":"tool_use","id":"toolu_1","name":"` + tool + `","input":{}}]`
			stop = "tool_use"
		}
		fmt.Fprintf(w, `{"id":"m1","type":"message","role":"assistant","model":"claude-sonnet-4-6","content":%s,"stop_reason":"%s","usage":{"input_tokens":%d,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":5}}`, content, stop, 50+1000*countImages(body))
	case stream:
		w.Header().Set("Content-Type", "text/event-stream")
		var events []string
		for _, piece := range []string{"A ", "login ", "form."} {
			events = append(events, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"`+piece+`"},"finish_reason":null}]}`)
		}
		events = append(events, `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":1200,"completion_tokens":3,"total_tokens":1203}}`,
			`data: [DONE]`)
		f.stream(w, r, events)
	default:
		msg := `{"role":"assistant","content":"A login form."}`
		finish := "stop"
		if tool != "" {
			msg = `{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"` + tool + `","arguments":"{}"}}]}`
			finish = "tool_calls"
		}
		fmt.Fprintf(w, `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o","choices":[{"index":0,"message":%s,"finish_reason":"%s"}],"usage":{"prompt_tokens":%d,"completion_tokens":5,"total_tokens":%d}}`,
			msg, finish, 50+1000*countImages(body), 55+1000*countImages(body))
	}
}

func (f *fakeUpstream) stream(w http.ResponseWriter, r *http.Request, events []string) {
	fl := w.(http.Flusher)
	for i, ev := range events {
		if _, err := io.WriteString(w, ev+"\n\n"); err != nil {
			f.cancelled <- struct{}{}
			return
		}
		fl.Flush()
		if i == 0 && f.gate != nil {
			select {
			case <-f.gate:
			case <-time.After(5 * time.Second):
				f.mu.Lock()
				f.gateTimedOut = true
				f.mu.Unlock()
			}
		}
		select {
		case <-r.Context().Done():
			f.cancelled <- struct{}{}
			return
		case <-time.After(f.eventGap):
		}
	}
}

// gw is a gateway on in-memory stores in front of a fake upstream.
type gw struct {
	srv    *httptest.Server
	server *Server
	done   *finished // its requests, to wait for before reading what they leave behind
	engine *engine.Engine
	up     *fakeUpstream
	images *imagestore.Mem
}

// tinyProfile: gpt-4o's tile rule in a 20,000-token window, so the image
// budget (10%) is 2,000 tokens: under two 1280×800 screenshots.
var tinyProfile = tokens.Profile{Name: "tiny", Match: []string{"tiny-*"}, Family: "openai", ContextWindow: 20000, Vision: true,
	Tokenizer: "chars4", Image: tokens.ImageRule{Rule: "openai_tile", BaseTokens: 85, TileTokens: 170}}

func newGW(t *testing.T, format upstream.Format, keys map[string]string) *gw {
	return newGWWith(t, format, Config{Keys: keys, MaxBodyBytes: 8 << 20}, discardLogger())
}

// newGWWith is newGW with its config and log.
func newGWWith(t *testing.T, format upstream.Format, cfg Config, log *slog.Logger) *gw {
	g := &gw{up: newFake(t, format), images: &imagestore.Mem{}}
	tbl, _ := tokens.Default().With(tinyProfile)
	g.engine = &engine.Engine{
		Images: imagestore.Verified{Store: g.images}, Sessions: &session.Mem{}, Profiles: tbl,
		Upstream: &upstream.Client{Format: format, BaseURL: g.up.srv.URL, APIKey: "upstream-key", MaxRetries: -1},
		Fetcher:  &media.Fetcher{Timeout: 2 * time.Second, AnyPort: true, Log: discardLogger()},
		Shrinker: &media.Shrinker{},
	}
	g.serve(t, New(cfg, g.engine, prometheus.NewRegistry(), log))
	return g
}

// serve puts s behind the test's listener.
func (g *gw) serve(t *testing.T, s *Server) {
	g.server, g.done = s, finish(s)
	g.srv = httptest.NewServer(g.done)
	t.Cleanup(g.srv.Close)
	t.Cleanup(g.server.Close)
}

func (g *gw) stored(t *testing.T, tenant string) int {
	n := 0
	g.images.List(t.Context(), tenant, func(imagestore.Info) error { n++; return nil })
	return n
}

func (g *gw) do(t *testing.T, method, path, key string, body []byte, header ...string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), method, g.srv.URL+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// imageSite serves img as a PNG at path, and 404 elsewhere: a web server
// for images by URL (a Fetcher that allows loopback reaches it).
func imageSite(t *testing.T, path string, img []byte) *httptest.Server {
	site := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "image/png")
		w.Write(img)
	}))
	t.Cleanup(site.Close)
	return site
}

func samplePNG(t testing.TB) (raw []byte, b64 string) {
	raw, err := os.ReadFile("../testdata/screenshot.png")
	if err != nil {
		t.Fatal(err)
	}
	return raw, base64.StdEncoding.EncodeToString(raw)
}

func metric(t *testing.T, g *gw, name string) string {
	g.done.wait() // a request's line is counted once its answer is the client's
	resp, body := g.do(t, "GET", "/metrics", "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("metrics: %d", resp.StatusCode)
	}
	var lines []string
	for _, l := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(l, name) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// distinctPNG returns the PNG with a text chunk naming n before its IEND:
// another valid image of the same size, with other bytes and another ref.
func distinctPNG(png []byte, n int) []byte {
	iend := bytes.LastIndex(png, []byte("IEND")) - 4
	body := append([]byte("tEXtn\x00"), fmt.Sprint(n)...)
	chunk := binary.BigEndian.AppendUint32(nil, uint32(len(body)-4))
	chunk = append(chunk, body...)
	chunk = binary.BigEndian.AppendUint32(chunk, crc32.ChecksumIEEE(body))
	return append(append(append([]byte(nil), png[:iend]...), chunk...), png[iend:]...)
}

// finished wraps a gateway's handler so that a test can wait until every
// request it began has ended, the decisions written behind its answer
// included: the client has the answer before they are written to the
// store, so a test that reads the store waits first.
type finished struct {
	http.Handler
	srv *Server
	wg  sync.WaitGroup
}

func finish(s *Server) *finished { return &finished{Handler: s.Handler(), srv: s} }

func (f *finished) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.wg.Add(1)
	defer f.wg.Done()
	f.Handler.ServeHTTP(w, r)
}

// wait returns once every request begun so far has ended.
func (f *finished) wait() {
	f.wg.Wait()
	f.srv.waitBehind()
}

// settledStore is a session store as a test reads it: each read first
// waits for the gateway's requests to end. Never the engine's own store
// (a request would wait for itself).
type settledStore struct {
	session.Store
	gw *finished
}

func (s settledStore) LoadProxied(ctx context.Context, tenant, key string) (session.Proxied, error) {
	s.gw.wait()
	return s.Store.LoadProxied(ctx, tenant, key)
}
