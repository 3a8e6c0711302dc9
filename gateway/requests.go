package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/wire/openai"
)

// MaxRequestID bounds a client's X-Request-Id kept as the request's id.
const MaxRequestID = 128

// requestID is the request's id: the client's X-Request-Id when it is a
// plain token (letters, digits and ._:-+=/@, at most MaxRequestID), else
// a fresh one.
func requestID(client string) string {
	if len(client) > 0 && len(client) <= MaxRequestID {
		ok := true
		for i := 0; i < len(client) && ok; i++ {
			c := client[i]
			ok = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._:-+=/@", c) >= 0
		}
		if ok {
			return client
		}
	}
	return newRequestID(time.Now())
}

// newRequestID is a fresh id ordered by time: the milliseconds since the
// epoch in its first 6 bytes, then 10 random ones (UUIDv7's layout), so
// ids sort as their requests came (the log's id index they were made for,
// which random ids cost a leaf a line, is gone: schema version 7).
func newRequestID(at time.Time) string {
	var b [16]byte
	ms := uint64(at.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	rand.Read(b[6:])
	return "req_" + hex.EncodeToString(b[:])
}

// inFlight is what the gateway knows of a request while it is served:
// its id for every log line, and the request log's line a handler that
// called an upstream fills in (nil otherwise).
type inFlight struct {
	id        string
	rec       *session.Request
	admission *admission // its part of what is in flight, once admitted
}

type inFlightKey struct{}

func withInFlight(ctx context.Context, f *inFlight) context.Context {
	return context.WithValue(ctx, inFlightKey{}, f)
}

func inFlightOf(ctx context.Context) *inFlight {
	f, _ := ctx.Value(inFlightKey{}).(*inFlight)
	return f
}

// record gives the request a line in the request log, for its handler to
// fill in; the wrapper adds what HTTP knows and writes it.
func record(ctx context.Context, rec session.Request) *session.Request {
	f := inFlightOf(ctx)
	if f == nil {
		return &rec
	}
	f.rec = &rec
	return f.rec
}

// recorded counts a request's line and hands it to the request log.
func (s *Server) recorded(r *session.Request) {
	s.metrics.logged(r)
	if s.reqlog != nil {
		s.reqlog.add(*r)
	}
}

// ms is a duration in milliseconds, to the microsecond.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// idHandler adds the request's id to every log line written with its
// context, the engine's included.
type idHandler struct{ slog.Handler }

func (h idHandler) Handle(ctx context.Context, r slog.Record) error {
	if f := inFlightOf(ctx); f != nil {
		r.AddAttrs(slog.String("request_id", f.id))
	}
	return h.Handler.Handle(ctx, r)
}

func (h idHandler) WithAttrs(as []slog.Attr) slog.Handler { return idHandler{h.Handler.WithAttrs(as)} }
func (h idHandler) WithGroup(g string) slog.Handler       { return idHandler{h.Handler.WithGroup(g)} }

// requestLog writes the request log's lines to the session store in
// batches, off the request path: a request only hands its line over. A
// full queue (the store stalled) drops lines, counted, rather than
// holding requests. Lines older than the retention, and past the row
// bound, are trimmed every minute.
type requestLog struct {
	store     session.Store
	retention time.Duration
	maxRows   int
	log       *slog.Logger
	metrics   *Metrics

	queue    chan session.Request
	stop     chan struct{}
	stopped  sync.WaitGroup
	closing  sync.Once
	flushNow chan chan struct{}
}

const (
	requestLogQueue = 4096
	requestLogBatch = 256
	requestLogEvery = 200 * time.Millisecond
	requestLogTrim  = time.Minute
)

func newRequestLog(store session.Store, retention time.Duration, maxRows int, log *slog.Logger, m *Metrics) *requestLog {
	l := &requestLog{store: store, retention: retention, maxRows: maxRows, log: log, metrics: m,
		queue: make(chan session.Request, requestLogQueue), stop: make(chan struct{}), flushNow: make(chan chan struct{})}
	l.stopped.Add(1)
	go l.run()
	return l
}

func (l *requestLog) add(r session.Request) {
	select {
	case l.queue <- r:
	default:
		l.metrics.requestLogDropped.Inc()
	}
}

func (l *requestLog) run() {
	defer l.stopped.Done()
	tick := time.NewTicker(requestLogEvery)
	defer tick.Stop()
	trim := time.NewTicker(requestLogTrim)
	defer trim.Stop()
	l.trim()
	var batch []session.Request
	flush := func() {
		if len(batch) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := l.store.AppendRequests(ctx, batch); err != nil {
			l.log.Error("request log: lines not written", "lines", len(batch), "err", err)
			l.metrics.requestLogDropped.Add(float64(len(batch)))
		}
		batch = batch[:0]
	}
	for {
		select {
		case r := <-l.queue:
			batch = append(batch, r)
			if len(batch) >= requestLogBatch {
				flush()
			}
		case <-tick.C:
			flush()
		case <-trim.C:
			flush()
			l.trim()
		case done := <-l.flushNow:
			l.drain(&batch)
			flush()
			close(done)
		case <-l.stop:
			l.drain(&batch)
			flush()
			return
		}
	}
}

// drain takes every line queued so far.
func (l *requestLog) drain(batch *[]session.Request) {
	for {
		select {
		case r := <-l.queue:
			*batch = append(*batch, r)
		default:
			return
		}
	}
}

func (l *requestLog) trim() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	left, err := l.store.TrimRequests(ctx, time.Now().Add(-l.retention), l.maxRows)
	if err != nil {
		l.log.Error("request log: trimming", "err", err)
		return
	}
	l.metrics.requestLogRows.Set(float64(left))
}

// Flush writes every line handed over so far (tests, and the dashboard's
// reader that wants its own request).
func (l *requestLog) Flush() {
	done := make(chan struct{})
	select {
	case l.flushNow <- done:
		<-done
	case <-l.stop:
	}
}

func (l *requestLog) Close() {
	l.closing.Do(func() {
		close(l.stop)
		l.stopped.Wait()
	})
}

// listRequests answers GET /v1/requests: the tenant's request log, newest
// first, filtered by conversation, model, id and since (RFC 3339 or unix
// seconds), at most limit lines.
func (s *Server) listRequests(w http.ResponseWriter, r *http.Request, tenant string) {
	q := r.URL.Query()
	f := session.RequestFilter{Tenant: tenant, ID: q.Get("id"), Conversation: q.Get("conversation"), Model: q.Get("model")}
	if v := q.Get("since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			n, nerr := strconv.ParseInt(v, 10, 64)
			if nerr != nil {
				writeError(w, openai.Dialect, http.StatusBadRequest, "invalid_request_error", "since: an RFC 3339 time (2026-12-02T07:00:00Z) or unix seconds")
				return
			}
			t = time.Unix(n, 0)
		}
		f.Since = t
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			writeError(w, openai.Dialect, http.StatusBadRequest, "invalid_request_error", "limit: a positive number of lines (at most "+strconv.Itoa(session.MaxRequestList)+")")
			return
		}
		f.Limit = n
	}
	if s.reqlog != nil {
		s.reqlog.Flush()
	}
	rs, err := s.engine.Sessions.ListRequests(r.Context(), f)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	if rs == nil {
		rs = []session.Request{}
	}
	replyJSON(w, http.StatusOK, map[string]any{"object": "list", "data": rs})
}
