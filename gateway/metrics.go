package gateway

import (
	"strings"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/reason"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the imgctx_* families of docs/design.md "Metrics", on an injected registry.
type Metrics struct {
	requests    *prometheus.CounterVec
	images      *prometheus.CounterVec
	imageBytes  *prometheus.CounterVec
	upstream    *prometheus.CounterVec
	tokens      *prometheus.CounterVec
	compactions *prometheus.CounterVec
	overflow    *prometheus.CounterVec
	latency     prometheus.Histogram
	scanned     *prometheus.CounterVec
}

// NewMetrics registers the families on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_http_requests_total",
			Help: "HTTP requests served, by route and status code."}, []string{"route", "code"}),
		images: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_images_total",
			Help: "Images by event (stored, sent, not_sent, trial, kept, ephemeral, removed, shrunk, refused) and reason code."}, []string{"event", "reason"}),
		imageBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_image_bytes_total",
			Help: "Image bytes by event (stored, attached)."}, []string{"event"}),
		upstream: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_upstream_requests_total",
			Help: "Requests sent upstream, by provider format and status code."}, []string{"provider", "status"}),
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_tokens_total",
			Help: "Tokens the upstream reported, by kind (input, cache_read, cache_write, output)."}, []string{"kind"}),
		compactions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_compactions_total",
			Help: "Compactions by kind (summary: a slimmed side query; summary_shared: on the cached live prefix; micro)."}, []string{"kind"}),
		overflow: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_overflow_retries_total",
			Help: "Replays after prompt-too-long or a cut completion, by reason (overflow, compaction) and outcome (ok, failed; replayed by the sessions engine)."}, []string{"reason", "outcome"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "imgctx_gateway_added_latency_seconds",
			Help:    "Time the gateway adds to a proxied request, upstream time excluded.",
			Buckets: []float64{50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3}}),
	}
	m.scanned = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_proxy_messages_total",
		Help: "Messages of proxied requests, by how they were read: scanned, or taken over from the conversation's previous request (resumed)."}, []string{"how"})
	reg.MustRegister(m.requests, m.images, m.imageBytes, m.upstream, m.tokens, m.compactions, m.overflow, m.latency, m.scanned)
	return m
}

func (m *Metrics) usage(u *chat.Usage) {
	if u == nil {
		return
	}
	m.tokens.WithLabelValues("input").Add(float64(u.Prompt))
	m.tokens.WithLabelValues("cache_read").Add(float64(u.CacheRead))
	m.tokens.WithLabelValues("cache_write").Add(float64(u.CacheWrite))
	m.tokens.WithLabelValues("output").Add(float64(u.Output))
}

// proxied counts what one proxied request did.
func (m *Metrics) proxied(c engine.ProxyCounts) {
	add := func(v *prometheus.CounterVec, n int64, labels ...string) {
		if n > 0 {
			v.WithLabelValues(labels...).Add(float64(n))
		}
	}
	add(m.scanned, int64(c.Resumed), "resumed")
	add(m.scanned, int64(c.Scanned), "scanned")
	add(m.images, int64(c.Stored), "stored", "")
	add(m.imageBytes, c.StoredBytes, "stored")
	add(m.images, int64(c.Deduplicated), "deduplicated", "")
	for code, n := range c.NotSent {
		add(m.images, int64(n), "not_sent", string(code))
	}
	add(m.images, int64(c.Shrunk), "shrunk", string(reason.ProviderLimit))
	add(m.images, int64(c.Sent), "sent", "")
	if c.Overflow != "" {
		m.overflow.WithLabelValues(string(reason.Overflow), c.Overflow).Inc()
	}
}

// engineEvent turns the engine's decisions into counts.
func (m *Metrics) engineEvent(e engine.Event) {
	switch e.Kind {
	case "kept", "removed", "stored", "shrunk", "ephemeral":
		// An ephemeral image is still sent in its turn; its removal at the
		// turn's end is the one "removed" count.
		m.images.WithLabelValues(e.Kind, string(e.Reason)).Inc()
	case "refused":
		m.images.WithLabelValues("refused", string(e.Reason)).Inc()
	case "compacted":
		kind := "summary"
		switch {
		case strings.HasPrefix(e.Detail, "microcompaction"):
			kind = "micro"
		case strings.Contains(e.Detail, "cache-sharing"):
			kind = "summary_shared"
		}
		m.compactions.WithLabelValues(kind).Inc()
	case "retried":
		m.overflow.WithLabelValues(string(e.Reason), "replayed").Inc()
	}
}
