package engine

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// startSpan starts a child of the request's span: the engine is traced
// exactly when its caller is, by the caller's provider, with nothing to
// configure here (no span in ctx: a no-op).
func startSpan(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() && !parent.SpanContext().IsValid() {
		return ctx, parent // untraced: a no-op span, without a context built for it on every request
	}
	return parent.TracerProvider().Tracer("github.com/imgctx/imgctx/engine").Start(ctx, name, opts...)
}

// traceContext writes the upstream call's traceparent, so the provider's
// side (or a collector in between) continues the request's trace.
var traceContext = propagation.TraceContext{}
