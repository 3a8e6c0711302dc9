package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/imgctx/imgctx/internal/config"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// tracerProvider builds the OTLP/HTTP trace exporter of trace.endpoint,
// or nil when tracing is off. Spans are batched; stop flushes them.
func tracerProvider(ctx context.Context, c config.Trace) (*sdktrace.TracerProvider, func(), error) {
	if c.Endpoint == "" {
		return nil, func() {}, nil
	}
	u, err := url.Parse(c.Endpoint)
	if err != nil || u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return nil, nil, fmt.Errorf("trace.endpoint %q: an http(s) URL of an OTLP/HTTP collector, e.g. http://127.0.0.1:4318/v1/traces", c.Endpoint)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces" // the collector's default traces path
	}
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(u.String()))
	if err != nil {
		return nil, nil, fmt.Errorf("trace exporter: %w", err)
	}
	res := resource.NewSchemaless(attribute.String("service.name", c.ServiceName), attribute.String("service.version", version))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(c.SampleRatio))))
	return tp, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tp.Shutdown(sctx) // the last spans, within 5 s; a collector that is down loses them
	}, nil
}

// endpointShown is trace.endpoint without credentials, for the log.
func endpointShown(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return ""
	}
	u.User = nil
	return strings.TrimSuffix(u.String(), "/")
}
