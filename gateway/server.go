// Package gateway is imgctx's HTTP face. It only does HTTP: it reads
// request bodies within their limits and deadlines, authenticates, admits
// (requests and bytes in flight, per tenant), routes by path, and hands
// each drop-in request (OpenAI Chat Completions and Responses, Anthropic
// Messages, Gemini generateContent, and their token counts) to the engine
// in one call, engine.Proxy, then relays the answer, streamed event by
// event. It also serves the image API, the stateful sessions API (on
// engine.Call), models listings, metrics and health. Errors come back in
// the client's own wire shape (wire.Dialect.ErrorBody).
package gateway

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/recall"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"
)

// Config tunes the gateway. Zero fields take the defaults.
type Config struct {
	// Keys maps API keys to tenants. Empty: no authentication, every request
	// is tenant "default".
	Keys map[string]string
	// PassClientKey forwards a client's own X-Upstream-Api-Key header as the
	// upstream key instead of the configured one (with Keys set).
	PassClientKey bool
	// UpstreamKeys maps tenants to the upstream key their requests carry
	// (with Keys set), over the upstream's configured key.
	UpstreamKeys map[string]string
	// Upstreams is the routing table of the drop-in routes; empty: the
	// engine's upstream serves them all.
	Upstreams []*Upstream
	// MaxBodyBytes bounds a request body after decompression; default 128
	// MB: more than the providers accept, since imgctx cuts images out of
	// what it forwards.
	MaxBodyBytes int64
	// MaxConcurrent bounds requests in flight; past it the gateway answers
	// 429 at once. Default 64.
	MaxConcurrent int
	// MaxConcurrentPerTenant bounds one tenant's requests in flight;
	// default three quarters of MaxConcurrent when Keys has tenants, else
	// MaxConcurrent.
	MaxConcurrentPerTenant int
	// MaxInflightBytes bounds the request bodies being held at once
	// (Content-Length, or MaxBodyBytes when unknown; a compressed body by
	// what it decompresses to, as it is read): peak memory stays near
	// three times it. Default 256 MB.
	MaxInflightBytes int64
	// BodyTimeout and MinBodyRate give a body its time to arrive: the
	// timeout plus its length at the rate; defaults 10 s and 1 MB/s.
	BodyTimeout time.Duration
	MinBodyRate int64
	// RequestTimeout bounds one request, upstream included; default 10 min.
	RequestTimeout time.Duration
	// ProxyKeepOff turns keep-turn-images off for proxied conversations
	// (a client can still say X-Imgctx-Keep-Turn-Images: on).
	ProxyKeepOff bool
	// Recall puts a recall handle in every image marker of proxied
	// conversations, for the MCP server at /mcp (a client can still say
	// X-Imgctx-Recall: on or off).
	Recall bool
	// Version is what the MCP server says of itself.
	Version string
	// MaxMessages and MaxParts bound the messages and content parts of one
	// proxied request (413 past them); defaults 10,000 and 50,000.
	MaxMessages, MaxParts int
	// MaxResponseBytes bounds a non-streamed upstream answer; past it the
	// client gets a 502 naming the limit, never a cut body. Default 64 MB.
	MaxResponseBytes int64
	// RequestLog keeps a line per request in the session store, written
	// in batches by a goroutine Close stops (GET /v1/requests answers what
	// was logged either way). RequestRetention and RequestMaxRows bound
	// it: defaults 7 days and 100,000 lines.
	RequestLog bool
	// UI serves the dashboard at /ui to loopback clients (their tenant's,
	// with auth.keys set), and to anyone with UIAdminKey (every tenant).
	UI         bool
	UIAdminKey string
	// Tracer, when set, traces every request: a server span continuing the
	// client's traceparent, with the engine's spans as children and the
	// upstream call's traceparent its own.
	Tracer           trace.TracerProvider
	RequestRetention time.Duration
	RequestMaxRows   int
}

// maxMCPBody bounds one MCP request: a tool call names a handle.
const maxMCPBody = 1 << 20

// Server serves the gateway's routes. Build it with New.
type Server struct {
	cfg           Config
	engine        *engine.Engine
	metrics       *Metrics
	log           *slog.Logger
	inflight      int // requests in flight, under mu
	inflightBytes int64
	perTenant     map[string]tenantLoad
	reg           prometheus.Gatherer

	mu       sync.Mutex
	draining atomic.Bool
	reqlog   *requestLog // nil when off
	tracer   trace.Tracer

	behind chan struct{} // a slot for each write behind an answer (closeBehind)
}

// Close waits for the decisions still being written behind answers,
// writes the request log's last lines and stops its writer, and lets go
// of the request bodies the engine held to resume conversations (nothing
// then waits to put them back in the pool); the routes still serve.
func (s *Server) Close() {
	s.waitBehind()
	if s.reqlog != nil {
		s.reqlog.Close()
	}
	s.engine.Close()
}

// Drain makes /readyz answer 503 (draining) from now on, while every route
// still serves: a load balancer stops sending new requests before the
// process shuts down.
func (s *Server) Drain() { s.draining.Store(true) }

// New builds a server on an engine (its image store, upstream and profiles
// serve the proxy too). Metrics register on reg; log may be nil.
func New(cfg Config, e *engine.Engine, reg *prometheus.Registry, log *slog.Logger) *Server {
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 128 << 20
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 64
	}
	if cfg.MaxInflightBytes <= 0 {
		cfg.MaxInflightBytes = 256 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = 10 * time.Second
	}
	if cfg.MinBodyRate <= 0 {
		cfg.MinBodyRate = 1 << 20
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 10 * time.Minute
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = 64 << 20
	}
	if cfg.RequestRetention <= 0 {
		cfg.RequestRetention = 7 * 24 * time.Hour
	}
	if cfg.RequestMaxRows <= 0 {
		cfg.RequestMaxRows = 100_000
	}
	if log == nil {
		log = slog.Default()
	}
	if _, ok := log.Handler().(idHandler); !ok {
		log = slog.New(idHandler{log.Handler()})
	}
	s := &Server{cfg: cfg, engine: e, metrics: NewMetrics(reg), log: log, reg: reg,
		perTenant: map[string]tenantLoad{}, tracer: tracerOf(cfg.Tracer), behind: make(chan struct{}, cfg.MaxConcurrent)}
	if cfg.RequestLog {
		s.reqlog = newRequestLog(e.Sessions, cfg.RequestRetention, cfg.RequestMaxRows, log, s.metrics)
	}
	// Every attempt at an upstream is counted, retries included.
	for _, up := range s.upstreams() {
		if up.Client != nil {
			up.Client.Attempted = s.attempted(up.Name, up.Client.Format)
		}
	}
	// The engine logs where the gateway does, unless it has a log of its
	// own; either way its lines carry the request's id.
	if e.Log == nil {
		e.Log = log
	} else if _, ok := e.Log.Handler().(idHandler); !ok {
		e.Log = slog.New(idHandler{e.Log.Handler()})
	}
	// Engine decisions feed the metrics, and still reach any sink the
	// caller had set.
	if prev := e.Sink; prev != nil {
		e.Sink = func(ev engine.Event) { s.metrics.engineEvent(ev); prev(ev) }
	} else {
		e.Sink = s.metrics.engineEvent
	}
	return s
}

// Handler returns the routes. Each path also answers other methods with a
// 405 in the right shape.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern, name string, sh *wire.Dialect, h func(http.ResponseWriter, *http.Request, string)) {
		mux.Handle(pattern, s.wrap(name, sh, true, h))
	}
	route("POST /v1/chat/completions", "chat_completions", openai.Dialect, func(w http.ResponseWriter, r *http.Request, t string) { s.proxy(w, r, t, openai.Dialect, false) })
	route("POST /v1/messages", "messages", anthropic.Dialect, func(w http.ResponseWriter, r *http.Request, t string) { s.proxy(w, r, t, anthropic.Dialect, false) })
	route("POST /v1/messages/count_tokens", "count_tokens", anthropic.Dialect, func(w http.ResponseWriter, r *http.Request, t string) { s.proxy(w, r, t, anthropic.Dialect, true) })
	route("POST /v1/responses", "responses", openai.Dialect, func(w http.ResponseWriter, r *http.Request, t string) { s.proxy(w, r, t, responses.Dialect, false) })
	route("POST /v1/responses/input_tokens", "responses_input_tokens", openai.Dialect, func(w http.ResponseWriter, r *http.Request, t string) { s.proxy(w, r, t, responses.Dialect, true) })
	route("POST /v1/responses/compact", "responses_compact", openai.Dialect, func(w http.ResponseWriter, r *http.Request, t string) { s.proxy(w, r, t, responses.Dialect, true) })
	route("GET /v1/responses", "responses_websocket", openai.Dialect, s.noWebSocket)
	route("POST /v1beta/models/{call}", "gemini", gemini.Dialect, s.gemini)
	route("GET /v1beta/models", "models", gemini.Dialect, s.models)
	route("GET /v1beta/models/{id}", "models", gemini.Dialect, s.models)
	route("GET /v1/models", "models", openai.Dialect, s.models)
	route("GET /v1/models/{id...}", "models", openai.Dialect, s.models)
	route("POST /v1/images", "images_post", openai.Dialect, s.postImage)
	route("GET /v1/images/{ref}", "images_get", openai.Dialect, s.getImage)
	route("POST /v1/sessions", "sessions_create", openai.Dialect, s.createSession)
	route("GET /v1/sessions/{id}", "sessions_get", openai.Dialect, s.getSession)
	route("DELETE /v1/sessions/{id}", "sessions_delete", openai.Dialect, s.deleteSession)
	route("PATCH /v1/sessions/{id}", "sessions_patch", openai.Dialect, s.patchSession)
	route("POST /v1/sessions/{id}/turn", "sessions_turn", openai.Dialect, s.turn)
	route("GET /v1/sessions/{id}/export", "sessions_export", openai.Dialect, s.exportSession)
	route("GET /v1/sessions/{id}/keepimg", "keepimg", openai.Dialect, s.keepimg)
	route("POST /v1/sessions/{id}/keepimg/store", "keepimg_store", openai.Dialect, s.keepimgStore)
	route("GET /v1/requests", "requests", openai.Dialect, s.listRequests)
	if s.cfg.UI {
		s.uiRoutes(mux)
	}
	// The recall tools over MCP, for every method (the SDK answers GET
	// and DELETE with 405: it keeps no session between requests).
	tools := recall.Handler(s.engine, s.cfg.Version)
	route("/mcp", "mcp", openai.Dialect, func(w http.ResponseWriter, r *http.Request, t string) {
		r.Body = http.MaxBytesReader(w, r.Body, maxMCPBody)
		tools.ServeHTTP(w, r.WithContext(recall.WithTenant(r.Context(), t)))
	})
	for _, p := range []struct {
		path string
		sh   *wire.Dialect
	}{
		{"/v1/chat/completions", openai.Dialect}, {"/v1/responses", openai.Dialect}, {"/v1/responses/input_tokens", openai.Dialect},
		{"/v1/responses/compact", openai.Dialect}, {"/v1/messages", anthropic.Dialect}, {"/v1/messages/count_tokens", anthropic.Dialect}, {"/v1/images", openai.Dialect},
		{"/v1/images/{ref}", openai.Dialect}, {"/v1/sessions", openai.Dialect}, {"/v1/sessions/{id}", openai.Dialect},
		{"/v1/sessions/{id}/turn", openai.Dialect}, {"/v1/sessions/{id}/export", openai.Dialect},
		{"/v1/sessions/{id}/keepimg", openai.Dialect}, {"/v1/sessions/{id}/keepimg/store", openai.Dialect},
	} {
		mux.Handle(p.path, s.wrap("method_not_allowed", p.sh, false, func(w http.ResponseWriter, r *http.Request, _ string) {
			writeError(w, p.sh, http.StatusMethodNotAllowed, "invalid_request_error", "method "+r.Method+" is not allowed on "+r.URL.Path)
		}))
	}
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /readyz", s.ready)
	// Everything else: a JSON 404 in the client's shape, logged and counted.
	mux.Handle("/", s.wrap("not_found", openai.Dialect, false, s.notFound))
	return mux
}

// noWebSocket answers a WebSocket upgrade on /v1/responses with 426, so a
// client that tries the WebSocket mode first falls back to HTTP, where the
// gateway manages its images.
func (s *Server) noWebSocket(w http.ResponseWriter, r *http.Request, _ string) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		writeError(w, openai.Dialect, http.StatusMethodNotAllowed, "invalid_request_error", "method GET is not allowed on "+r.URL.Path)
		return
	}
	w.Header().Set("Upgrade", "HTTP/1.1")
	writeError(w, openai.Dialect, http.StatusUpgradeRequired, "invalid_request_error", "imgctx serves the Responses API over HTTP, not WebSocket: POST /v1/responses")
}

// gemini serves /v1beta/models/{model}:{method}: generateContent and
// streamGenerateContent as conversation requests, countTokens as a side
// request with the same image decisions.
func (s *Server) gemini(w http.ResponseWriter, r *http.Request, tenant string) {
	_, method, _ := strings.Cut(r.PathValue("call"), ":")
	switch method {
	case "generateContent", "streamGenerateContent":
		s.proxy(w, r, tenant, gemini.Dialect, false)
	case "countTokens":
		s.proxy(w, r, tenant, gemini.Dialect, true)
	default:
		writeError(w, gemini.Dialect, http.StatusNotFound, "not_found_error", "imgctx has no route POST "+r.URL.Path)
	}
}

// readyProbe is the ref /readyz asks the image store about.
var readyProbe = blob.Of([]byte("imgctx readiness probe"))

// ready answers /readyz: 503 when the session store does not answer (no
// request can be served); 200 when the image store does not either, its
// body saying the replica is degraded — text-only requests still flow,
// and those that need an image fail fast with 503, so an outage of a
// shared bucket does not take every replica out of a load balancer. The
// causes go to the log, not the body.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "draining: shutting down", http.StatusServiceUnavailable)
		return
	}
	if err := s.engine.Sessions.Ping(r.Context()); err != nil {
		s.log.Error("readiness: the session store does not answer", "err", err)
		http.Error(w, "session store unavailable (the server's log has the cause)", http.StatusServiceUnavailable)
		return
	}
	// One HEAD (S3) or stat (FS) of a ref nobody stores: not found means
	// the image store answers.
	if _, err := s.engine.Images.Stat(r.Context(), imagestore.DefaultTenant, readyProbe); err != nil && !errors.Is(err, imagestore.ErrNotFound) {
		s.log.Warn("readiness: the image store does not answer: degraded", "err", err)
		io.WriteString(w, "ready, degraded: image store unavailable (requests with images answer 503; the server's log has the cause)\n")
		return
	}
	io.WriteString(w, "ready\n")
}

// statusWriter records what a handler wrote, for the log line and metrics.
type statusWriter struct {
	http.ResponseWriter
	status int
	bytes  int64
	first  time.Time // the status line written
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status, w.first = code, time.Now()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status, w.first = http.StatusOK, time.Now()
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// wrap adds what every API route needs: a request id (X-Request-Id, the
// client's kept), a concurrency bound, a timeout, authentication (when
// auth is true), one structured log line, and the request log's line of a
// request that called an upstream.
func (s *Server) wrap(name string, sh *wire.Dialect, auth bool, h func(http.ResponseWriter, *http.Request, string)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		tenant := ""
		fl := &inFlight{id: requestID(r.Header.Get("X-Request-Id"))}
		w.Header().Set("X-Request-Id", fl.id)
		w.Header().Set("X-Imgctx-Request-Id", fl.id)
		ctx, span := s.startRequest(r, name, fl.id)
		r = r.WithContext(withInFlight(ctx, fl))
		defer func() {
			if sw.status == 0 {
				sw.status = http.StatusOK
			}
			took := time.Since(start)
			s.metrics.requests.WithLabelValues(name, strconv.Itoa(sw.status)).Inc()
			// Typed attributes: the line is written on every request, and
			// key-value pairs would box each number.
			s.log.LogAttrs(r.Context(), slog.LevelInfo, "request", slog.String("route", name), slog.String("method", r.Method),
				slog.String("path", clip(r.URL.Path)), slog.Int("status", sw.status), slog.String("tenant", tenant),
				slog.Int64("bytes_in", r.ContentLength), slog.Int64("bytes_out", sw.bytes), slog.Int64("duration_ms", took.Milliseconds()))
			if rec := fl.rec; rec != nil {
				rec.ID, rec.Time, rec.Tenant, rec.Route, rec.Status = fl.id, start, tenant, name, sw.status
				rec.DurationMS, rec.BytesIn, rec.BytesOut = ms(took), max(r.ContentLength, 0), sw.bytes
				if !sw.first.IsZero() {
					rec.FirstByteMS = ms(sw.first.Sub(start))
				}
				s.recorded(rec)
			}
			endRequest(span, sw.status, fl.rec)
		}()
		// A body must arrive within its deadline: a client that stalls
		// holds its slot for that long at most. Once it has arrived, the
		// deadline is lifted, or it would cut a long streamed answer.
		if r.ContentLength != 0 {
			rc := http.NewResponseController(sw)
			rc.SetReadDeadline(time.Now().Add(s.bodyDeadline(r)))
			r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, left: r.ContentLength}
		}
		busy := func(msg string) {
			// The body is drained, not held (within its deadline, with no
			// slot taken), so the client reads the answer instead of a reset.
			io.Copy(io.Discard, io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
			s.fail(sw, sh, errInFlight(msg))
		}
		// Who asks comes first (a constant-time check), so that one tenant's
		// requests cannot take every slot.
		if auth {
			var ok bool
			if tenant, ok = s.authenticate(r); !ok {
				writeError(sw, sh, http.StatusUnauthorized, "authentication_error", "missing or unknown API key (Authorization: Bearer <key> or x-api-key)")
				return
			}
		}
		adm, why := s.admit(tenant, r)
		if why != "" {
			busy(why)
			return
		}
		defer adm.release()
		fl.admission = adm
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		h(sw, r, tenant)
	})
}

// deadlineBody lifts the connection's read deadline once the body has
// been read whole.
type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	left int64 // bytes still to come; negative: unknown length
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if b.left > 0 {
		b.left -= int64(n)
	}
	if !b.done && (err == io.EOF || b.left == 0) {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// admit takes a slot for the request — one of MaxConcurrent, one of its
// tenant's share, and its body's size from the bytes in flight — or says
// why not.
func (s *Server) admit(tenant string, r *http.Request) (*admission, string) {
	bytes := r.ContentLength
	if bytes < 0 || bytes > s.cfg.MaxBodyBytes {
		bytes = s.cfg.MaxBodyBytes // unknown length: the most it may be
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		bytes = 0
	}
	a := &admission{s: s, tenant: tenant}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inflight >= s.cfg.MaxConcurrent {
		return nil, fmt.Sprintf("more than %d requests in flight", s.cfg.MaxConcurrent)
	}
	if t := s.perTenant[tenant]; t.requests >= s.tenantShare() {
		return nil, fmt.Sprintf("more than %d requests of this tenant in flight", s.tenantShare())
	}
	if why := a.take(bytes); why != "" {
		return nil, why
	}
	s.inflight++
	t := s.perTenant[tenant]
	s.perTenant[tenant] = tenantLoad{t.requests + 1, t.bytes}
	return a, ""
}

// admission is one request's part of what is in flight.
type admission struct {
	s      *Server
	tenant string
	bytes  int64 // of bodies in flight, counted for it
}

// take counts n more bytes of the request's body in flight, under s.mu,
// or says why not.
func (a *admission) take(n int64) string {
	s := a.s
	t := s.perTenant[a.tenant]
	shareBytes := s.cfg.MaxInflightBytes * int64(s.tenantShare()) / int64(s.cfg.MaxConcurrent)
	switch {
	case n > 0 && s.inflightBytes+n > s.cfg.MaxInflightBytes:
		return fmt.Sprintf("more than %d bytes of request bodies in flight", s.cfg.MaxInflightBytes)
	case n > 0 && t.bytes+n > shareBytes:
		return fmt.Sprintf("more than %d bytes of this tenant's request bodies in flight", shareBytes)
	}
	s.inflightBytes += n
	s.perTenant[a.tenant] = tenantLoad{t.requests, t.bytes + n}
	a.bytes += n
	return ""
}

// grow counts n more bytes of a body that turned out larger than it was
// admitted for — a compressed one, counted by its length, as it
// decompresses — or refuses them (errInFlight).
func (a *admission) grow(n int64) error {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	if why := a.take(n); why != "" {
		return errInFlight(why)
	}
	return nil
}

// release gives the slot and its bytes back.
func (a *admission) release() {
	s := a.s
	s.mu.Lock()
	defer s.mu.Unlock()
	s.inflight--
	s.inflightBytes -= a.bytes
	t := s.perTenant[a.tenant]
	if t.requests <= 1 {
		delete(s.perTenant, a.tenant)
	} else {
		s.perTenant[a.tenant] = tenantLoad{t.requests - 1, t.bytes - a.bytes}
	}
}

// errInFlight refuses a request past what may be in flight — requests,
// or bytes of their bodies: 429, to be retried shortly.
type errInFlight string

func (e errInFlight) Error() string { return string(e) }

// heldReader counts a decompressing body's bytes in flight as they come,
// a megabyte at a time past what its admission holds.
type heldReader struct {
	io.Reader
	a    *admission
	read int64
}

func (h *heldReader) Read(p []byte) (int, error) {
	n, err := h.Reader.Read(p)
	h.read += int64(n)
	if h.read > h.a.bytes {
		if gerr := h.a.grow((h.read - h.a.bytes + 1<<20 - 1) &^ (1<<20 - 1)); gerr != nil {
			return n, gerr
		}
	}
	return n, err
}

// tenantLoad is what one tenant has in flight.
type tenantLoad struct {
	requests int
	bytes    int64
}

// tenantShare is how many requests one tenant may have in flight: with
// several tenants (API keys configured), three quarters of the slots (and
// as large a share of the bytes in flight).
func (s *Server) tenantShare() int {
	if s.cfg.MaxConcurrentPerTenant > 0 {
		return s.cfg.MaxConcurrentPerTenant
	}
	if len(s.cfg.Keys) == 0 {
		return s.cfg.MaxConcurrent
	}
	return max(1, s.cfg.MaxConcurrent*3/4)
}

// bodyDeadline is how long a request's body may take to arrive: a base,
// plus its length at the minimum rate.
func (s *Server) bodyDeadline(r *http.Request) time.Duration {
	n := max(r.ContentLength, 0)
	if r.ContentLength < 0 {
		n = s.cfg.MaxBodyBytes
	}
	d := s.cfg.BodyTimeout + time.Duration(float64(n)/float64(s.cfg.MinBodyRate)*float64(time.Second))
	return min(d, s.cfg.RequestTimeout)
}

func (s *Server) authenticate(r *http.Request) (string, bool) {
	if len(s.cfg.Keys) == 0 {
		return imagestore.DefaultTenant, true
	}
	key := r.Header.Get("x-api-key")
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		key = v
	}
	if strings.HasPrefix(r.URL.Path, "/v1beta/") && key == "" {
		// Gemini clients: x-goog-api-key, or key= in the query.
		if key = r.Header.Get("x-goog-api-key"); key == "" {
			key = r.URL.Query().Get("key")
		}
	}
	if key == "" {
		return "", false
	}
	for k, tenant := range s.cfg.Keys {
		if subtle.ConstantTimeCompare([]byte(k), []byte(key)) == 1 {
			return tenant, true
		}
	}
	return "", false
}

// clip bounds a client-supplied value for a log line.
func clip(s string) string {
	if len(s) <= 256 {
		return s
	}
	return fmt.Sprintf("%.256s… (%d bytes)", s, len(s))
}

// readBody reads a request body within the limit, after decompression.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	b, _, err := s.readBodyInto(r, func(n int) []byte { return make([]byte, n) }, nil)
	return b, err
}

// arrivingFrom is the body size from which a drop-in request is compared
// with its conversation's previous one as it arrives: below it the
// compare is too short to matter.
const arrivingFrom = 64 << 10

// readBodyInto is readBody with the buffer of a known-size body from
// alloc. With arriving, a large body of known size is compared, as it
// comes, with its conversation's previous request: arriving is handed the
// body's first bytes and its length, and returns the buffer to read it
// into (the first bytes in it), the engine.Arriving comparing it (returned
// with the body; released on an error) and the request it may have started
// upstream with what matched (upstream.Early). A buffer the previous
// request's memory (engine.Arriving.Take) is read into in place.
func (s *Server) readBodyInto(r *http.Request, alloc func(n int) []byte, arriving func(head []byte, n int) ([]byte, *engine.Arriving, *upstream.Early)) ([]byte, *engine.Arriving, error) {
	var rd io.Reader = r.Body
	if enc := r.Header.Get("Content-Encoding"); enc != "" && !strings.EqualFold(enc, "identity") {
		d, err := decompress(enc, r.Body)
		if err != nil {
			return nil, nil, err
		}
		defer d.Close()
		rd = d
		if f := inFlightOf(r.Context()); f != nil && f.admission != nil {
			rd = &heldReader{Reader: d, a: f.admission}
		}
	}
	var b []byte
	var a *engine.Arriving
	var err error
	switch n := r.ContentLength; {
	case rd == r.Body && n >= arrivingFrom && n <= s.cfg.MaxBodyBytes && arriving != nil:
		aside := asideBuffers.Get().(*[asideSize]byte)
		defer asideBuffers.Put(aside)
		head := aside[:min(int(n), engine.ArrivingHead)]
		if _, err = io.ReadFull(rd, head); err == nil {
			var early *upstream.Early
			b, a, early = arriving(head, int(n))
			err = readComparing(rd, b, len(head), a, early, aside[:])
		}
	case rd == r.Body && n > 0 && n <= s.cfg.MaxBodyBytes:
		// Known size: one exact allocation instead of a doubling buffer.
		b = alloc(int(n))
		_, err = io.ReadFull(rd, b)
	default:
		b, err = io.ReadAll(io.LimitReader(rd, s.cfg.MaxBodyBytes+1))
	}
	if err != nil {
		a.Release()
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return nil, nil, errBodyTimeout
	}
	if busy := errInFlight(""); errors.As(err, &busy) {
		// Its compressed rest is drained, not held, so the client reads
		// the answer instead of a reset.
		io.Copy(io.Discard, io.LimitReader(r.Body, s.cfg.MaxBodyBytes))
		return nil, nil, err
	}
	if err != nil {
		return nil, nil, reason.Wrap(reason.Invalid, "reading the body", err)
	}
	if int64(len(b)) > s.cfg.MaxBodyBytes {
		return nil, nil, reason.New(reason.TooLarge, fmt.Sprintf("request body is over the limit of %d bytes", s.cfg.MaxBodyBytes))
	}
	return b, a, nil
}

// asideSize is the reads of a body arriving into its conversation's
// previous request (engine.Arriving.Take): each is compared before it is
// written, so it lands aside first, in a buffer that stays in the cache.
const asideSize = 128 << 10

var asideBuffers = sync.Pool{New: func() any { return new([asideSize]byte) }}

// readComparing fills b from rd past its first off bytes, as io.ReadFull
// does, handing each read to a to compare while the rest is on the way,
// and what matched the previous request to early to send (both may be
// nil). Where b is the previous request's memory (Take), the bytes that
// still match are read into aside (engine.Arriving.ReadsAside), and only
// those that differ are written to b.
func readComparing(rd io.Reader, b []byte, off int, a *engine.Arriving, early *upstream.Early, aside []byte) error {
	early.Advance(a.Known())
	for off < len(b) {
		dst := b[off:]
		compared := a.ReadsAside(off)
		if compared {
			dst = aside[:min(len(aside), len(dst))]
		}
		n, err := rd.Read(dst)
		a.Compare(off, dst[:n])
		if k := a.Known(); compared && k < off+n {
			copy(b[k:off+n], dst[k-off:n])
		}
		off += n
		early.Advance(a.Known())
		if err != nil && off < len(b) {
			if err == io.EOF {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// errBodyTimeout: the body did not arrive within its deadline.
var errBodyTimeout = errors.New("the request body did not arrive in time (server.body_timeout, server.min_body_rate)")

// classify maps an error to a status and an error type.
func classify(err error) (int, string) {
	var we *wire.Error
	var nr *engine.NoRouteError
	switch {
	case errors.As(err, &we):
		return we.Status, we.Type
	case errors.As(err, &nr):
		return http.StatusNotFound, "not_found_error"
	case errors.Is(err, engine.ErrNoUpstream):
		return http.StatusBadGateway, "api_error"
	case errors.Is(err, engine.ErrUnsupported):
		return http.StatusUnsupportedMediaType, "invalid_request_error"
	case errors.Is(err, engine.ErrUnknownRef), errors.Is(err, session.ErrNotFound), errors.Is(err, imagestore.ErrNotFound):
		return http.StatusNotFound, "not_found_error"
	case errors.Is(err, engine.ErrContextFull):
		return http.StatusBadRequest, "context_length_exceeded"
	case errors.Is(err, engine.ErrBadTurn):
		return http.StatusConflict, "invalid_request_error"
	case errors.Is(err, engine.ErrKeyReused):
		return http.StatusUnprocessableEntity, "invalid_request_error"
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "timeout_error"
	case errors.Is(err, errBodyTimeout):
		return http.StatusRequestTimeout, "timeout_error"
	}
	switch reason.Of(err) {
	case reason.Invalid:
		return http.StatusBadRequest, "invalid_request_error"
	case reason.TooLarge:
		return http.StatusRequestEntityTooLarge, "request_too_large"
	case reason.FetchFailed:
		return http.StatusUnprocessableEntity, "invalid_request_error"
	case reason.Refused:
		return http.StatusInsufficientStorage, "api_error"
	}
	if strings.HasPrefix(err.Error(), "upstream:") {
		return http.StatusBadGateway, "api_error"
	}
	return http.StatusInternalServerError, "api_error"
}

// fail writes err in the route's shape; an upstream error passes through
// with the provider's own status and body.
func (s *Server) fail(w http.ResponseWriter, sh *wire.Dialect, err error) {
	var we *wire.Error
	if errors.As(err, &we) && len(we.Body) > 0 {
		// The upstream's own answer: agents match on its wording.
		if we.Header != nil {
			copyHeader(w.Header(), we.Header)
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		if we.RetryAfter > 0 && w.Header().Get("Retry-After") == "" {
			w.Header().Set("Retry-After", fmt.Sprint(int(we.RetryAfter.Seconds()+0.5)))
		}
		w.WriteHeader(we.Status)
		w.Write(we.Body)
		return
	}
	status, typ := classify(err)
	msg := err.Error()
	var ue *url.Error
	var ne net.Error
	transport := errors.As(err, &ue) || errors.As(err, &ne)
	if transport && reason.Of(err) == reason.Refused {
		// The image store cannot be reached (an S3 outage), not full: a
		// request that needs it fails fast, and may be retried.
		ref := s.errorID(http.StatusServiceUnavailable, err)
		w.Header().Set("Retry-After", "5")
		writeError(w, sh, http.StatusServiceUnavailable, "api_error", fmt.Sprintf("the image store is unavailable; retry shortly (error %s; the server's log has the cause)", ref))
		return
	}
	if busy := errInFlight(""); errors.As(err, &busy) {
		w.Header().Set("Retry-After", "1")
		writeError(w, sh, http.StatusTooManyRequests, "rate_limit_error", err.Error()+"; retry shortly")
		return
	}
	if errors.Is(err, engine.ErrBusy) {
		// Decodes hold all the memory they may: the request waited its
		// turn and may come back shortly.
		w.Header().Set("Retry-After", "2")
		writeError(w, sh, http.StatusServiceUnavailable, "api_error", err.Error())
		return
	}
	if transport && (status == http.StatusBadGateway || status == http.StatusGatewayTimeout) {
		// A transport error names the upstream's host and port (or a
		// resolver's): the log gets it, the client what happened and an id.
		ref := s.errorID(status, err)
		what := "the model server could not be reached"
		if status == http.StatusGatewayTimeout || errors.Is(err, context.DeadlineExceeded) || ne != nil && ne.Timeout() {
			what = "the model server did not answer in time"
		}
		writeError(w, sh, status, typ, fmt.Sprintf("upstream: %s (error %s; the server's log has the cause)", what, ref))
		return
	}
	if status == http.StatusInsufficientStorage && errors.Is(err, imagestore.ErrQuota) {
		// The tenant's own share used up: the message names the quota and
		// nothing of the infrastructure.
		writeError(w, sh, status, typ, msg)
		return
	}
	if status == http.StatusInternalServerError || status == http.StatusInsufficientStorage {
		// The cause names files, hosts, database users, buckets and object
		// keys: the log gets it, the client an id to quote.
		ref := s.errorID(status, err)
		msg = fmt.Sprintf("%s (error %s; the server's log has the cause)", http.StatusText(status), ref)
		if code := reason.Of(err); code != "" {
			msg = fmt.Sprintf("%s: %s (error %s; the server's log has the cause)", code, http.StatusText(status), ref)
		}
	}
	writeError(w, sh, status, typ, msg)
}

// errorID logs a failure's cause under a fresh id, for the client to quote.
func (s *Server) errorID(status int, err error) string {
	var id [6]byte
	rand.Read(id[:])
	ref := hex.EncodeToString(id[:])
	s.log.Error("request failed", "status", status, "error_id", ref, "err", err)
	return ref
}

func writeError(w http.ResponseWriter, sh *wire.Dialect, status int, typ, msg string) {
	replyJSON(w, status, sh.ErrorBody(status, typ, msg))
}
