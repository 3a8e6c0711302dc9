package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"image"
	"image/png"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/internal/bodies"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Run with: go test ./gateway -run XXX -bench Gateway -benchtime 2s
//
// Each benchmark sends the same requests through plain
// httputil.ReverseProxy and through the gateway, to the same upstream, and
// reports the median (p50) per request; the gateway's added latency is the
// difference of the two p50s.

const (
	completion = `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":1}}`
	message    = `{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","usage":{"input_tokens":10,"output_tokens":1}}`

	chatPath     = "/v1/chat/completions"
	messagesPath = "/v1/messages"
)

func benchUpstream(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == messagesPath {
			io.WriteString(w, message)
			return
		}
		io.WriteString(w, completion)
	}))
	b.Cleanup(srv.Close)
	return srv
}

func benchGateway(b *testing.B, up string) (*httptest.Server, *imagestore.Mem) {
	return benchGatewayFor(b, up, upstream.OpenAI)
}

func benchGatewayFor(b *testing.B, up string, format upstream.Format) (*httptest.Server, *imagestore.Mem) {
	mem := &imagestore.Mem{}
	e := &engine.Engine{Images: imagestore.Verified{Store: mem}, Sessions: &session.Mem{}, Profiles: tokens.Default(),
		Upstream: &upstream.Client{Format: format, BaseURL: up, MaxRetries: -1}}
	s := New(Config{MaxBodyBytes: 64 << 20, MaxConcurrent: 1024}, e, prometheus.NewRegistry(), discardLogger())
	srv := httptest.NewServer(s.Handler())
	b.Cleanup(srv.Close)
	return srv, mem
}

func reverseProxy(b *testing.B, up string) *httptest.Server {
	u, _ := url.Parse(up)
	srv := httptest.NewServer(httputil.NewSingleHostReverseProxy(u))
	b.Cleanup(srv.Close)
	return srv
}

// p50 sends body b.N times to the endpoint and reports the median latency.
func p50(b *testing.B, target string, body []byte) {
	p50Of(b, target, func(int) []byte { return body })
}

// p50Of sends body(i) for the i-th request and reports the median latency.
func p50Of(b *testing.B, target string, body func(i int) []byte) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var lat []time.Duration
	b.SetBytes(int64(len(body(0))))
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		req := body(i) // built before the clock starts
		start := time.Now()
		resp, err := client.Post(target, "application/json", bytes.NewReader(req))
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
}

func textRequest() []byte {
	text := bytes.Repeat([]byte("word "), 190) // ≈1 KB body
	body, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []any{map[string]any{"role": "user", "content": string(text)}}})
	return body
}

// screenshots returns n distinct noisy PNGs of about size bytes each.
func screenshots(n, side int) [][]byte {
	var out [][]byte
	for i := range n {
		img := image.NewNRGBA(image.Rect(0, 0, side, side))
		r := rand.New(rand.NewPCG(uint64(i), 7))
		for j := range img.Pix {
			img.Pix[j] = uint8(r.IntN(256))
		}
		var buf bytes.Buffer
		png.Encode(&buf, img)
		out = append(out, buf.Bytes())
	}
	return out
}

func imageRequest(urls []string) []byte {
	parts := []any{map[string]any{"type": "text", "text": "Compare these screenshots."}}
	for _, u := range urls {
		parts = append(parts, map[string]any{"type": "image_url", "image_url": map[string]string{"url": u}})
	}
	body, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []any{map[string]any{"role": "user", "content": parts}}})
	return body
}

func BenchmarkGateway1KBText(b *testing.B) {
	up := benchUpstream(b)
	gw, _ := benchGateway(b, up.URL)
	body := textRequest()
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50(b, reverseProxy(b, up.URL).URL+chatPath, body) })
	b.Run("gateway", func(b *testing.B) { p50(b, gw.URL+chatPath, body) })
}

func BenchmarkGateway5MB6Screenshots(b *testing.B) {
	up := benchUpstream(b)
	gw, mem := benchGateway(b, up.URL)
	shots := screenshots(6, 360) // 6 × ≈520 KB PNG → ≈4.2 MB of base64
	var inline, refs []string
	for _, s := range shots {
		inline = append(inline, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(s))
		ref := blob.Of(s)
		mem.Put(b.Context(), "default", ref, s)
		refs = append(refs, "imgctx:"+ref.String())
	}
	body, byRef := imageRequest(inline), imageRequest(refs)
	b.Logf("inline body %d bytes, by-ref body %d bytes", len(body), len(byRef))
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50(b, reverseProxy(b, up.URL).URL+chatPath, body) })
	b.Run("gateway-inline", func(b *testing.B) { p50(b, gw.URL+chatPath, body) })
	b.Run("gateway-by-ref", func(b *testing.B) { p50(b, gw.URL+chatPath, byRef) })
}

// BenchmarkGatewayAgent: what coding agents send — 200 text messages with
// tool calls and six 1280×800 screenshots in tool results (≈2.2 MB),
// re-sent as the history grows; by ref; pretty-printed. The store is a
// directory, as in imgctx serve.
func BenchmarkGatewayAgent(b *testing.B) {
	up := benchUpstream(b)
	fsys, err := imagestore.NewFS(b.TempDir())
	store := imagestore.Verified{Store: fsys}
	if err != nil {
		b.Fatal(err)
	}
	e := &engine.Engine{Images: store, Sessions: &session.Mem{}, Profiles: tokens.Default(),
		Upstream: &upstream.Client{Format: upstream.OpenAI, BaseURL: up.URL, MaxRetries: -1}}
	gw := httptest.NewServer(New(Config{MaxBodyBytes: 64 << 20, MaxConcurrent: 1024}, e, prometheus.NewRegistry(), discardLogger()).Handler())
	b.Cleanup(gw.Close)
	var inline, refs []string
	for i := range 6 {
		s := bodies.Screenshot(uint64(i))
		inline = append(inline, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(s))
		ref := blob.Of(s)
		store.Put(b.Context(), "default", ref, s)
		refs = append(refs, "imgctx:"+ref.String())
	}
	body, byRef := bodies.Agent(inline), bodies.Agent(refs)
	var pretty bytes.Buffer
	json.Indent(&pretty, body, "", "  ")
	b.Logf("agent body %d bytes, by ref %d, pretty %d", len(body), len(byRef), pretty.Len())
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50(b, reverseProxy(b, up.URL).URL+chatPath, body) })
	b.Run("gateway-resent", func(b *testing.B) { p50(b, gw.URL+chatPath, body) })
	b.Run("gateway-by-ref", func(b *testing.B) { p50(b, gw.URL+chatPath, byRef) })
	b.Run("gateway-pretty", func(b *testing.B) { p50(b, gw.URL+chatPath, pretty.Bytes()) })
	// As scripts/abmeter sends it: the history at 41 to 50 rounds, growing
	// by one a request, then again from 41.
	var growing [][]byte
	for r := 41; r <= 50; r++ {
		growing = append(growing, bodies.AgentRounds(inline, r))
	}
	b.Run("baseline=reverseproxy-growing", func(b *testing.B) {
		p50Of(b, reverseProxy(b, up.URL).URL+chatPath, func(i int) []byte { return growing[i%len(growing)] })
	})
	b.Run("gateway-growing", func(b *testing.B) {
		p50Of(b, gw.URL+chatPath, func(i int) []byte { return growing[i%len(growing)] })
	})
}

// BenchmarkGatewayAnthropic5MB6Screenshots: the same six screenshots as
// base64 sources on /v1/messages, to an upstream speaking Anthropic.
func BenchmarkGatewayAnthropic5MB6Screenshots(b *testing.B) {
	up := benchUpstream(b)
	gw, mem := benchGatewayFor(b, up.URL, upstream.Anthropic)
	request := func(data []string) []byte {
		content := []any{map[string]any{"type": "text", "text": "Compare these screenshots."}}
		for _, d := range data {
			content = append(content, map[string]any{"type": "image", "source": map[string]string{"type": "base64", "media_type": "image/png", "data": d}})
		}
		body, _ := json.Marshal(map[string]any{"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": []any{map[string]any{"role": "user", "content": content}}})
		return body
	}
	var inline, refs []string
	for _, s := range screenshots(6, 360) {
		inline = append(inline, base64.StdEncoding.EncodeToString(s))
		ref := blob.Of(s)
		mem.Put(b.Context(), "default", ref, s)
		refs = append(refs, "imgctx:"+ref.String())
	}
	body, byRef := request(inline), request(refs)
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50(b, reverseProxy(b, up.URL).URL+messagesPath, body) })
	b.Run("gateway-inline", func(b *testing.B) { p50(b, gw.URL+messagesPath, body) })
	b.Run("gateway-by-ref", func(b *testing.B) { p50(b, gw.URL+messagesPath, byRef) })
}

// BenchmarkGatewayThroughput: 1 KB text requests from 16 concurrent
// clients; target ≥ 5,000 requests/s through the gateway.
func BenchmarkGatewayThroughput(b *testing.B) {
	up := benchUpstream(b)
	gw, _ := benchGateway(b, up.URL)
	body := textRequest()
	run := func(b *testing.B, target string) {
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
		b.SetParallelism(8) // 16 goroutines on 2 cores
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := client.Post(target+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
	}
	b.Run("baseline=reverseproxy", func(b *testing.B) { run(b, reverseProxy(b, up.URL).URL) })
	b.Run("gateway", func(b *testing.B) { run(b, gw.URL) })
	// As serve runs by default: SQLite, every request's line in the log.
	b.Run("gateway,log=on", func(b *testing.B) { run(b, sqliteGateway(b, up.URL, true, nil)) })
}

// BenchmarkGateway5MBNewScreenshots: every request carries six images the
// gateway has never seen (decoded, checked, hashed, stored, then sent).
// The 64 bodies are built up front, so run at most 64 requests:
//
//	go test ./gateway -run XXX -bench 5MBNew -benchtime 40x
func BenchmarkGateway5MBNewScreenshots(b *testing.B) {
	up := benchUpstream(b)
	shots := screenshots(6, 360)
	bodies := make([][]byte, 64)
	for i := range bodies {
		var urls []string
		for j, s := range shots {
			s = bytes.Clone(s)
			binary.LittleEndian.PutUint32(s[100:], uint32(i)) // a different image (and ref) each time
			s[104] = byte(j)
			urls = append(urls, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(s))
		}
		bodies[i] = imageRequest(urls)
	}
	body := func(i int) []byte {
		if i >= len(bodies) {
			b.Fatalf("run with -benchtime %dx or fewer: each request must carry new images", len(bodies))
		}
		return bodies[i]
	}
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50Of(b, reverseProxy(b, up.URL).URL+chatPath, body) })
	b.Run("gateway", func(b *testing.B) {
		gw, _ := benchGateway(b, up.URL) // a new store: nothing seen before
		p50Of(b, gw.URL+chatPath, body)
	})
}

// BenchmarkGatewayPeakMemory: eight 5.1 MB inline requests in flight at
// once; the live heap and the body buffers in use outside it are sampled
// every millisecond and the peak above the idle figure, per request, is reported
// against the body size (target ≤ 3×).
func BenchmarkGatewayPeakMemory(b *testing.B) {
	up := benchUpstream(b)
	for _, name := range []string{"baseline=reverseproxy", "gateway"} {
		b.Run(name, func(b *testing.B) {
			target := reverseProxy(b, up.URL).URL
			if name == "gateway" {
				gw, _ := benchGateway(b, up.URL)
				target = gw.URL
			}
			shots := screenshots(6, 360)
			var urls []string
			for _, s := range shots {
				urls = append(urls, "data:image/png;base64,"+base64.StdEncoding.EncodeToString(s))
			}
			body := imageRequest(urls)
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
			post := func() {
				resp, err := client.Post(target+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			post() // warm: caches, connections
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			idle := ms.HeapAlloc + uint64(inUse(bodyBuffers))
			var peak atomic.Uint64
			done := make(chan struct{})
			go func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(time.Millisecond):
						var m runtime.MemStats
						runtime.ReadMemStats(&m)
						if now := m.HeapAlloc + uint64(inUse(bodyBuffers)); now > peak.Load() {
							peak.Store(now)
						}
					}
				}
			}()
			const inflight = 8
			for b.Loop() {
				var wg sync.WaitGroup
				for range inflight {
					wg.Go(post)
				}
				wg.Wait()
			}
			close(done)
			perRequest := float64(peak.Load()-idle) / inflight
			b.ReportMetric(perRequest/float64(len(body)), "peak×body")
		})
	}
}

// BenchmarkGatewayRequestLog is the request log's cost on a 1 KB text
// request: the log off, and on over a SQLite file (its lines written in
// batches off the request path), beside ReverseProxy in the same run.
func BenchmarkGatewayRequestLog(b *testing.B) {
	up := benchUpstream(b)
	body := textRequest()
	gateway := func(log bool, tp trace.TracerProvider) string { return sqliteGateway(b, up.URL, log, tp) }
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50(b, reverseProxy(b, up.URL).URL+chatPath, body) })
	b.Run("log=off", func(b *testing.B) { p50(b, gateway(false, nil)+chatPath, body) })
	b.Run("log=on", func(b *testing.B) { p50(b, gateway(true, nil)+chatPath, body) })
	// Every request traced, its spans batched to an exporter that drops them.
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardSpans{}))
	b.Cleanup(func() { tp.Shutdown(context.Background()) })
	b.Run("log=on,traces=on", func(b *testing.B) { p50(b, gateway(true, tp)+chatPath, body) })
}

// sqliteGateway is a gateway over a SQLite file, as `imgctx serve` runs
// by default, its request log on or off, traced by tp (nil: untraced).
func sqliteGateway(b *testing.B, up string, log bool, tp trace.TracerProvider) string {
	store, err := sqlite.Open(filepath.Join(b.TempDir(), "imgctx.db"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.Close() })
	e := &engine.Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: store, Profiles: tokens.Default(),
		Upstream: &upstream.Client{Format: upstream.OpenAI, BaseURL: up, MaxRetries: -1}}
	s := New(Config{MaxBodyBytes: 64 << 20, MaxConcurrent: 1024, RequestLog: log, Tracer: tp}, e, prometheus.NewRegistry(), discardLogger())
	b.Cleanup(s.Close)
	srv := httptest.NewServer(s.Handler())
	b.Cleanup(srv.Close)
	return srv.URL
}

// discardSpans is a span exporter that drops what it is given.
type discardSpans struct{}

func (discardSpans) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardSpans) Shutdown(context.Context) error                             { return nil }

// BenchmarkGatewayLongHistory: a text-only agent history of 3,201
// messages (800 rounds with tool calls), re-sent as it is and growing by
// one round a request, beside httputil.ReverseProxy; and the same growing
// with six screenshots in its tool results, whose B/op says whether the
// engine copies the history a request.
func BenchmarkGatewayLongHistory(b *testing.B) {
	up := benchUpstream(b)
	gw, _ := benchGateway(b, up.URL)
	const rounds = 800
	growing := make([][]byte, 64)
	shots := make([]string, 6)
	for i := range shots {
		shots[i] = "data:image/png;base64," + base64.StdEncoding.EncodeToString(bodies.Screenshot(uint64(100+i)))
	}
	withShots := make([][]byte, 64)
	for i := range growing {
		growing[i] = bodies.AgentRounds(nil, rounds+i)
		withShots[i] = bodies.AgentRounds(shots, rounds+i)
	}
	body := growing[0]
	b.Logf("history %d bytes", len(body))
	b.Run("baseline=reverseproxy", func(b *testing.B) { p50(b, reverseProxy(b, up.URL).URL+chatPath, body) })
	b.Run("gateway-resent", func(b *testing.B) { p50(b, gw.URL+chatPath, body) })
	b.Run("gateway-growing", func(b *testing.B) {
		p50Of(b, gw.URL+chatPath, func(i int) []byte { return growing[i%len(growing)] })
	})
	b.Run("gateway-growing-6-screenshots", func(b *testing.B) {
		p50Of(b, gw.URL+chatPath, func(i int) []byte { return withShots[i%len(withShots)] })
	})
}
