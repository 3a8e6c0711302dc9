package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"go.opentelemetry.io/otel/attribute"
)

// proxy serves a drop-in route: it reads the body and hands it, with its
// wire and the request as it is forwarded, to the engine in one call
// (engine.Proxy), then relays the answer: the upstream's headers, status
// and body or stream as they came, or the answer imgctx made itself.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, tenant string, d *wire.Dialect, side bool) {
	rec := record(r.Context(), session.Request{Wire: d.Name})
	up := upstream.Request{Path: r.URL.Path, Query: s.forwardQuery(r), Header: s.forwardHeader(r), APIKey: s.upstreamKey(r, tenant)}
	// The body's buffer goes back to the pool once this handler and every
	// upstream reader of it are done (the engine's view and the request
	// share its memory), read whole or not: it is outside the heap, and
	// nothing else would free it. The conversation's next request may
	// take it over instead (bodyRef.Take).
	readers := &bodyRef{}
	readers.Add(1)
	defer readers.Done()
	var early *upstream.Early
	defer func() { early.Abandon() }() // unless the engine took it
	get := func(n int) []byte {
		b, ok := bodyBuffers.get(n)
		if ok {
			readers.b = b
		}
		return b
	}
	body, arriving, err := s.readBodyInto(r, get, func(head []byte, n int) ([]byte, *engine.Arriving, *upstream.Early) {
		a := s.engine.Arriving(tenant, d, r.Header, head)
		buf := a.Take(n) // its first bytes are head's already
		if buf != nil {
			s.metrics.bodiesInPlace.Inc()
			readers.b = buf
		} else {
			buf = get(n)
			copy(buf, head)
		}
		if changes, ok := a.Sent(len(buf)); ok && !side {
			early = s.startEarly(r, d, up, buf, changes, readers)
		}
		return buf, a, early
	})
	if err != nil {
		rec.Error = clip(err.Error())
		s.fail(w, d, err)
		return
	}
	ctx := r.Context()
	p, err := s.engine.Proxy(ctx, engine.ProxyCall{Tenant: tenant, Wire: d, Body: body, Header: r.Header, Upstream: up,
		Routes: s.upstreams(), Keep: s.keepFor(r), Recall: s.recallFor(r), Side: side, Readers: readers, Arriving: arriving, Early: early,
		MaxMessages: s.cfg.MaxMessages, MaxParts: s.cfg.MaxParts, MaxResponseBytes: s.cfg.MaxResponseBytes})
	if err != nil {
		rec.Error = clip(err.Error())
		if we := (*wire.Error)(nil); errors.As(err, &we) && we.Header != nil {
			rec.UpstreamID = upstreamID(we.Header)
		}
		s.fail(w, d, err)
		return
	}
	var usage *chat.Usage
	defer func() {
		// A stream's decisions are settled here, once it has ended (a
		// whole answer's were before it went out).
		if err := p.Settle(ctx); err != nil {
			s.log.ErrorContext(ctx, "proxy", "err", err)
		}
		// The line is the engine's account of the request, the answer's
		// usage priced, with the provider's own id of it.
		*rec = p.Record(usage)
		rec.Wire = d.Name
		if p.Response != nil {
			rec.UpstreamID = upstreamID(p.Response.Header)
		}
		s.closeBehind(ctx, p, readers)
	}()
	s.metrics.proxied(p.Counts)
	if p.Reply != nil {
		for k, v := range p.Reply.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(p.Reply.Status)
		w.Write(p.Reply.Body)
		usage = p.Reply.Usage
		return
	}
	resp := p.Response
	copyHeader(w.Header(), resp.Header)
	if p.Streams() {
		s.metrics.latency.Observe(p.Counts.Before.Seconds())
		w.Header().Set("X-Accel-Buffering", "no")
		w.WriteHeader(resp.StatusCode)
		flusher, _ := w.(http.Flusher)
		_, span := s.tracer.Start(ctx, "imgctx.stream")
		usage = p.Relay(w, func() {
			if flusher != nil {
				flusher.Flush()
			}
		})
		span.SetAttributes(attribute.Bool("imgctx.stream.complete", usage != nil))
		span.End()
		return
	}
	// Not a stream (asked for or not): the answer as it came.
	b, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes+1))
	if err != nil {
		s.fail(w, d, reason.Wrap(reason.Invalid, "upstream: reading the response", err))
		return
	}
	if int64(len(b)) > s.cfg.MaxResponseBytes {
		for k := range w.Header() {
			delete(w.Header(), k)
		}
		writeError(w, d, http.StatusBadGateway, "api_error", fmt.Sprintf("the upstream's answer is over the limit of %d bytes (upstream.max_response_bytes)", s.cfg.MaxResponseBytes))
		return
	}
	post := time.Now()
	// The answer measured and the decisions settled, the next request of
	// the conversation starts from them however soon it comes; only their
	// write to the store waits until the answer is the client's.
	usage = p.Read(b)
	if err := p.Settle(ctx); err != nil {
		s.log.ErrorContext(ctx, "proxy", "err", err)
	}
	// Its length known, the answer goes out whole in one write: flushed
	// without it, it would go chunked, its end only once the handler
	// returns.
	if resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	s.metrics.latency.Observe((p.Counts.Before + time.Since(post)).Seconds())
}

// closeBehind closes a request once its answer is the client's, writing
// its decisions to the session store behind it: a stream ends, and a
// kept-alive connection reads its next request, only when the handler
// returns, so neither waits for the store. At most MaxConcurrent writes run
// behind answers; past that a request writes before it returns, so a
// stalled store slows requests down rather than piling up goroutines.
// waitBehind waits for them.
func (s *Server) closeBehind(ctx context.Context, p *engine.Proxied, readers wire.Readers) {
	ctx = context.WithoutCancel(ctx)
	closeIt := func() {
		if err := p.Close(ctx); err != nil {
			s.log.ErrorContext(ctx, "proxy", "err", err)
		}
	}
	if !p.Unwritten() {
		closeIt() // nothing to wait for
		return
	}
	select {
	case s.behind <- struct{}{}:
		readers.Add(1) // what is written behind may still read the body
		go func() {
			defer func() { <-s.behind }()
			defer readers.Done()
			closeIt()
		}()
	default:
		closeIt()
	}
}

// waitBehind returns once every write begun behind an answer is done: it
// holds every slot at once. Requests meanwhile write before returning.
func (s *Server) waitBehind() {
	for range cap(s.behind) {
		s.behind <- struct{}{}
	}
	for range cap(s.behind) {
		<-s.behind
	}
}

// startEarly sends the request up while its body arrives, on the guess
// that it goes as its conversation's previous request went: the client's
// bytes with the same changes (upstream.Early). Only when the gateway has
// one upstream for the client's own wire (a translation or a flat backend
// rewrites every body), and neither a Files API nor a trace of imgctx's
// own adds to the headers; nil otherwise.
func (s *Server) startEarly(r *http.Request, d *wire.Dialect, up upstream.Request, buf []byte, changes []wire.Change, readers wire.Readers) *upstream.Early {
	routes := s.upstreams()
	if len(routes) != 1 || routes[0].Client.Wire() != d || routes[0].Client.Format.Flat() || routes[0].Files || s.cfg.Tracer != nil {
		return nil
	}
	readers.Add(1)
	return routes[0].Client.Start(r.Context(), up, buf, changes, readers.Done)
}

// upstreamID is the provider's id of a request, from its answer's headers
// (OpenAI's x-request-id, Anthropic's request-id).
func upstreamID(h http.Header) string {
	for _, k := range []string{"X-Request-Id", "Request-Id"} {
		if v := h.Get(k); v != "" {
			return clip(v)
		}
	}
	return ""
}

// keepFor is the keep-turn-images switch of a proxied request: on unless
// the client says X-Imgctx-Keep-Turn-Images: off (or the config turns it
// off for every conversation). Like the sessions API's, it takes effect
// at the next turn.
func (s *Server) keepFor(r *http.Request) bool {
	switch strings.ToLower(r.Header.Get("X-Imgctx-Keep-Turn-Images")) {
	case "off", "false", "0":
		return false
	case "on", "true", "1":
		return true
	}
	return !s.cfg.ProxyKeepOff
}

// recallFor is whether a proxied request's markers carry recall handles:
// the config's choice (off by default: a model told of a tool its agent
// lacks tries to call it) unless the client says X-Imgctx-Recall. Turning
// it on or off mid-conversation changes the markers' text once.
func (s *Server) recallFor(r *http.Request) bool {
	switch strings.ToLower(r.Header.Get("X-Imgctx-Recall")) {
	case "off", "false", "0":
		return false
	case "on", "true", "1":
		return true
	}
	return s.cfg.Recall
}

// attempted counts one upstream attempt (every retry is one) and logs a
// failed one at WARN with its cause: a 5xx or a transport error.
func (s *Server) attempted(name string, format upstream.Format) func(*http.Response, error) {
	return func(resp *http.Response, err error) {
		status := "error"
		var we *wire.Error
		switch {
		case err == nil:
			status = http.StatusText(resp.StatusCode)
		case errors.As(err, &we):
			status = http.StatusText(we.Status)
			if we.Status >= 500 {
				s.log.Warn("upstream attempt failed", "upstream", name, "format", format, "status", we.Status, "err", clip(we.Error()))
			}
		default:
			s.log.Warn("upstream attempt failed", "upstream", name, "format", format, "err", clip(err.Error()))
		}
		s.metrics.upstream.WithLabelValues(string(format), status).Inc()
	}
}
