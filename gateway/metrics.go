package gateway

import (
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
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

	dollars           *prometheus.CounterVec
	upstreamTime      *prometheus.HistogramVec
	firstByte         *prometheus.HistogramVec
	breaks            *prometheus.CounterVec
	requestLogRows    prometheus.Gauge
	requestLogDropped prometheus.Counter
	files             *prometheus.CounterVec
	bodiesInPlace     prometheus.Counter
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
			Help: "Tokens the upstream reported, by model profile and kind (input, cache_read, cache_write, output)."}, []string{"model", "kind"}),
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
	seconds := []float64{.05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	m.dollars = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_cost_dollars_total",
		Help: "What the upstream's reported usage costs at the model profile's list prices, in US dollars, by model profile."}, []string{"model"})
	m.upstreamTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "imgctx_upstream_duration_seconds",
		Help: "Time of a request upstream (the answer read or streamed whole; the gateway's own time excluded), by upstream and model profile.", Buckets: seconds}, []string{"upstream", "model"})
	m.firstByte = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "imgctx_time_to_first_byte_seconds",
		Help: "Time from a request's arrival to the first byte of its answer, by route.", Buckets: seconds}, []string{"route"})
	m.breaks = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_cache_breaks_total",
		Help: "Requests whose usage shows a prompt-cache prefix break, by cause (image: it removed images; expired: idle past the cache's lifetime; other)."}, []string{"cause"})
	m.requestLogRows = prometheus.NewGauge(prometheus.GaugeOpts{Name: "imgctx_request_log_rows",
		Help: "Lines in the request log, as of its last trim."})
	m.requestLogDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "imgctx_request_log_dropped_total",
		Help: "Request log lines not written: the writer's queue was full or the store refused them."})
	m.files = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "imgctx_provider_files_total",
		Help: "Images sent by a provider's Files API (upstreams[].file_ids), by event: sent (by file id), uploaded, fallback (an upload failed: base64 instead), missing (the provider no longer had it: uploaded again, request replayed), off (a request while a quota has uploads off for its credential)."}, []string{"event"})
	m.bodiesInPlace = prometheus.NewCounter(prometheus.CounterOpts{Name: "imgctx_bodies_in_place_total",
		Help: "Proxied bodies read into their conversation's previous request's buffer: the bytes the two share not written again, one buffer held instead of two."})
	buffers := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "imgctx_body_buffer_bytes",
		Help: "Bytes of the buffers proxied request bodies are read into, in use or idle (at most 32 MB or one buffer, and a minute, idle): memory outside the Go heap."},
		func() float64 { return float64(bodyBuffers.held.Load()) })
	reg.MustRegister(buffers, m.requests, m.images, m.imageBytes, m.upstream, m.tokens, m.compactions, m.overflow, m.latency, m.scanned,
		m.dollars, m.upstreamTime, m.firstByte, m.breaks, m.requestLogRows, m.requestLogDropped, m.files, m.bodiesInPlace)
	return m
}

// logged counts what one request's line says: tokens and dollars by model
// profile (a bounded set: the profile table, "unknown" past it), the
// upstream's time, the first byte, a cache break.
func (m *Metrics) logged(r *session.Request) {
	model := r.Profile
	if model == "" {
		model = "unknown"
	}
	if r.Input+r.Output > 0 {
		m.tokens.WithLabelValues(model, "input").Add(float64(r.Input))
		m.tokens.WithLabelValues(model, "cache_read").Add(float64(r.CacheRead))
		m.tokens.WithLabelValues(model, "cache_write").Add(float64(r.CacheWrite))
		m.tokens.WithLabelValues(model, "output").Add(float64(r.Output))
	}
	if r.Priced {
		m.dollars.WithLabelValues(model).Add(r.Dollars)
	}
	if r.Upstream != "" && r.Error == "" {
		m.upstreamTime.WithLabelValues(r.Upstream, model).Observe(max(r.DurationMS-r.GatewayMS, 0) / 1000)
	}
	if r.FirstByteMS > 0 {
		m.firstByte.WithLabelValues(r.Route).Observe(r.FirstByteMS / 1000)
	}
	if r.Break {
		m.breaks.WithLabelValues(r.BreakCause).Inc()
	}
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
	add(m.files, int64(c.FilesSent), "sent")
	add(m.files, int64(c.FilesUploaded), "uploaded")
	add(m.files, int64(c.FileFallbacks), "fallback")
	add(m.files, int64(c.FilesMissing), "missing")
	if c.FilesOff {
		add(m.files, 1, "off")
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
		m.compactions.WithLabelValues(e.Compaction).Inc()
	case "retried":
		m.overflow.WithLabelValues(string(e.Reason), "replayed").Inc()
	}
}
