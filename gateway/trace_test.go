package gateway

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/upstream"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	collector "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an in-process OTLP/HTTP collector: it decodes what an
// exporter sends to /v1/traces.
type otlpReceiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var req collector.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" || proto.Unmarshal(b, &req) != nil {
			http.Error(w, "not OTLP/HTTP protobuf", http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				rc.spans = append(rc.spans, ss.Spans...)
			}
		}
		rc.mu.Unlock()
		out, _ := proto.Marshal(&collector.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// attrOf is a span attribute's value as text ("" when absent).
func attrOf(s *tracepb.Span, key string) string {
	for _, kv := range s.Attributes {
		if kv.Key != key {
			continue
		}
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_IntValue:
			return fmt.Sprint(v.IntValue)
		case *commonpb.AnyValue_BoolValue:
			return fmt.Sprint(v.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			return fmt.Sprint(v.DoubleValue)
		}
	}
	return ""
}

// A traced request: one server span that continues the client's
// traceparent, with children for the scan, the ingest, the decisions, the
// upstream call and the stream; the upstream is sent a traceparent of the
// same trace; the attributes are the GenAI conventions' and imgctx's.
func TestTracesReachACollector(t *testing.T) {
	rc := newReceiver(t)
	g, tp := tracedGW(t, rc, upstream.Anthropic)
	_, b64 := samplePNG(t)
	body := `{"model":"claude-sonnet-4-6","max_tokens":64,"stream":true,"messages":[{"role":"user","content":[{"type":"text","text":"look"},` +
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}`
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	resp, got := g.do(t, "POST", "/v1/messages", "", []byte(body), "traceparent", "00-"+traceID+"-00f067aa0ba902b7-01", "anthropic-version", "2023-06-01")
	if resp.StatusCode != 200 || !strings.Contains(string(got), "message_stop") {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	if err := tp.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	spans := append([]*tracepb.Span(nil), rc.spans...)
	rc.mu.Unlock()
	byName := map[string]*tracepb.Span{}
	for _, s := range spans {
		if hex.EncodeToString(s.TraceId) != traceID {
			t.Errorf("span %s is of trace %x, not the client's", s.Name, s.TraceId)
		}
		byName[s.Name] = s
	}
	t.Logf("%d spans", len(spans))
	root := byName["POST /v1/messages"]
	if root == nil {
		t.Fatalf("no server span among %d spans: %v", len(spans), byName)
	}
	if hex.EncodeToString(root.ParentSpanId) != "00f067aa0ba902b7" || root.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Fatalf("the server span's parent %x (kind %v), want the client's 00f067aa0ba902b7", root.ParentSpanId, root.Kind)
	}
	for _, name := range []string{"imgctx.scan", "imgctx.ingest", "imgctx.decide", "imgctx.upstream", "imgctx.stream"} {
		s := byName[name]
		if s == nil {
			t.Errorf("no %s span", name)
			continue
		}
		if string(s.ParentSpanId) != string(root.SpanId) {
			t.Errorf("%s is not a child of the request's span", name)
		}
	}
	for key, want := range map[string]string{
		"gen_ai.request.model": "claude-sonnet-4-6", "gen_ai.usage.input_tokens": "1030", "gen_ai.usage.output_tokens": "5",
		"gen_ai.usage.cache_read.input_tokens": "1000", "imgctx.images.sent": "1", "imgctx.images.removed": "0",
		"http.response.status_code": "200", "gen_ai.provider.name": "anthropic", "imgctx.prefix_break": "false",
	} {
		if got := attrOf(root, key); got != want {
			t.Errorf("%s = %q, want %s", key, got, want)
		}
	}
	if s := byName["imgctx.ingest"]; s != nil && attrOf(s, "imgctx.images.stored") != "1" {
		t.Errorf("ingest span: %v", s.Attributes)
	}
	if s := byName["imgctx.stream"]; s != nil && attrOf(s, "imgctx.stream.complete") != "true" {
		t.Errorf("stream span: %v", s.Attributes)
	}
	// The upstream got a traceparent of the same trace, the upstream
	// call's span its parent.
	if up := byName["imgctx.upstream"]; up != nil {
		want := "00-" + traceID + "-" + hex.EncodeToString(up.SpanId) + "-01"
		if got := g.up.traceparents(); len(got) != 1 || got[0] != want {
			t.Errorf("the upstream saw traceparent %q, want %s", got, want)
		}
		if up.Kind != tracepb.Span_SPAN_KIND_CLIENT || attrOf(up, "http.response.status_code") != "200" {
			t.Errorf("upstream span: %v %v", up.Kind, up.Attributes)
		}
	}
}

// Untraced, the client's traceparent reaches the upstream as it came.
func TestUntracedTraceparentPassesThrough(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if resp, b := g.do(t, "POST", "/v1/chat/completions", "", textRequest(), "traceparent", tp); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if got := g.up.traceparents(); len(got) != 1 || got[0] != tp {
		t.Fatalf("the upstream saw %q, want the client's %s", got, tp)
	}
}

// tracedGW is a gateway on format whose spans reach rc.
func tracedGW(t *testing.T, rc *otlpReceiver, format upstream.Format) (*gw, *sdktrace.TracerProvider) {
	exp, err := otlptracehttp.New(t.Context(), otlptracehttp.WithEndpointURL(rc.srv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(t.Context()) })
	return newGWWith(t, format, Config{MaxBodyBytes: 8 << 20, Tracer: tp}, discardLogger()), tp
}

// The request's span names what was not sent and why, the provider's id
// of the request, and a request that never reached the upstream carries
// its status alone.
func TestTracedRequestNamesWhatWasNotSent(t *testing.T) {
	rc := newReceiver(t)
	g, tp := tracedGW(t, rc, upstream.OpenAI)
	g.up.maxImages = 1 // prompt too long past one image: the earlier turn's leaves
	g.up.header = http.Header{"X-Request-Id": {"req_up_1"}}
	raw, _ := samplePNG(t)
	img := func(n int) map[string]any {
		return map[string]any{"type": "image_url", "image_url": map[string]string{"url": "data:image/png;base64," + base64.StdEncoding.EncodeToString(distinctPNG(raw, n))}}
	}
	body, _ := json.Marshal(map[string]any{"model": "gpt-4o", "messages": []any{map[string]any{"role": "user", "content": []any{img(1)}},
		map[string]any{"role": "assistant", "content": "A login form."}, map[string]any{"role": "user", "content": []any{img(2)}}}})
	if resp, b := g.do(t, "POST", "/v1/chat/completions", "", body); resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, b)
	}
	if resp, _ := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":`)); resp.StatusCode != 400 {
		t.Fatalf("malformed: %d", resp.StatusCode)
	}
	if err := tp.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var roots []*tracepb.Span
	for _, s := range rc.spans {
		if s.Name == "POST /v1/chat/completions" {
			roots = append(roots, s)
		}
	}
	if len(roots) != 2 {
		t.Fatalf("%d request spans, want 2", len(roots))
	}
	for key, want := range map[string]string{"imgctx.images.sent": "1", "imgctx.images.not_sent.overflow": "1", "imgctx.upstream_request_id": "req_up_1", "http.response.status_code": "200"} {
		if got := attrOf(roots[0], key); got != want {
			t.Errorf("%s = %q, want %s", key, got, want)
		}
	}
	if attrOf(roots[1], "http.response.status_code") != "400" || attrOf(roots[1], "gen_ai.request.model") != "" {
		t.Errorf("the malformed request's span: %v", roots[1].Attributes)
	}
}
