package gateway

import (
	"context"
	"net/http"

	"github.com/imgctx/imgctx/session"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracerName names the gateway's spans' instrumentation scope.
const tracerName = "github.com/imgctx/imgctx/gateway"

var incoming = propagation.TraceContext{}

// startRequest starts the request's server span, continuing the client's
// traceparent; the engine's spans are its children.
func (s *Server) startRequest(r *http.Request, route, id string) (context.Context, trace.Span) {
	ctx := incoming.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	if s.cfg.Tracer == nil {
		return s.tracer.Start(ctx, "") // a no-op span: nothing built for it
	}
	name := r.Pattern
	if name == "" {
		name = r.Method + " " + route
	}
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
		attribute.String("http.request.method", r.Method), attribute.String("url.path", clip(r.URL.Path)),
		attribute.String("http.route", route), attribute.String("imgctx.request_id", id)))
}

// endRequest ends it with the status and, for a request that called an
// upstream, its line: the GenAI semantic conventions' model and usage,
// and imgctx's images, bytes and cache break.
func endRequest(span trace.Span, status int, rec *session.Request) {
	if !span.IsRecording() {
		span.End() // untraced: no attributes built for it
		return
	}
	span.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		span.SetStatus(codes.Error, http.StatusText(status))
	}
	if rec == nil {
		span.End()
		return
	}
	sent, notSent := 0, map[string]int{}
	for _, img := range rec.Images {
		if img.Sent {
			sent++
		} else {
			notSent[string(img.Reason)]++
		}
	}
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.request.model", rec.Model), attribute.String("gen_ai.operation.name", "chat"),
		attribute.Int("gen_ai.usage.input_tokens", rec.Input), attribute.Int("gen_ai.usage.output_tokens", rec.Output),
		attribute.Int("gen_ai.usage.cache_read.input_tokens", rec.CacheRead), attribute.Int("gen_ai.usage.cache_creation.input_tokens", rec.CacheWrite),
		attribute.String("imgctx.tenant", rec.Tenant), attribute.String("imgctx.conversation", rec.Conversation),
		attribute.String("imgctx.profile", rec.Profile), attribute.String("imgctx.upstream", rec.Upstream),
		attribute.Int("imgctx.images.sent", sent), attribute.Int("imgctx.images.removed", rec.Removed),
		attribute.Int64("imgctx.bytes_in", rec.BytesIn), attribute.Int64("imgctx.bytes_out", rec.BytesOut),
		attribute.Bool("imgctx.prefix_break", rec.Break),
	}
	if rec.Wire != "" {
		attrs = append(attrs, attribute.String("gen_ai.provider.name", rec.Wire))
	}
	for why, n := range notSent {
		attrs = append(attrs, attribute.Int("imgctx.images.not_sent."+why, n))
	}
	if rec.Break {
		attrs = append(attrs, attribute.String("imgctx.break_cause", rec.BreakCause))
	}
	if rec.Priced {
		attrs = append(attrs, attribute.Float64("imgctx.dollars", rec.Dollars))
	}
	if rec.UpstreamID != "" {
		attrs = append(attrs, attribute.String("imgctx.upstream_request_id", rec.UpstreamID))
	}
	span.SetAttributes(attrs...)
	span.End()
}

// tracerOf is the configured provider's tracer, or a no-op one.
func tracerOf(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = noop.NewTracerProvider()
	}
	return tp.Tracer(tracerName)
}
