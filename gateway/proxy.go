package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
)

// proxied is a client request in either format, decoded.
type proxied struct {
	model  string
	stream bool
	msgs   []chat.Message
	encode func(ctx context.Context, msgs []chat.Message) (wire.Body, error)
}

func (s *Server) proxyOpenAI(w http.ResponseWriter, r *http.Request, tenant string) {
	s.proxy(w, r, tenant, upstream.OpenAI)
}

func (s *Server) proxyAnthropic(w http.ResponseWriter, r *http.Request, tenant string) {
	s.proxy(w, r, tenant, upstream.Anthropic)
}

func (s *Server) decode(format upstream.Format, body []byte, tenant string) (*proxied, error) {
	if format == upstream.Anthropic {
		req, err := anthropic.DecodeRequest(body)
		if err != nil {
			return nil, reason.Wrap(reason.Invalid, "malformed request", err)
		}
		return &proxied{model: req.Model, stream: req.Stream, msgs: req.Messages,
			encode: func(ctx context.Context, msgs []chat.Message) (wire.Body, error) {
				return req.EncodeBody(msgs, s.engine.ImageSource(ctx, tenant), anthropic.Cache{System: hasSystemBreakpoint(body)})
			}}, nil
	}
	req, err := openai.DecodeRequest(body)
	if err != nil {
		return nil, reason.Wrap(reason.Invalid, "malformed request", err)
	}
	return &proxied{model: req.Model, stream: req.Stream, msgs: req.Messages,
		encode: func(ctx context.Context, msgs []chat.Message) (wire.Body, error) {
			return req.EncodeBody(msgs, s.engine.ImageSource(ctx, tenant))
		}}, nil
}

// hasSystemBreakpoint keeps a client's breakpoint on its system prompt.
func hasSystemBreakpoint(body []byte) bool {
	i := strings.Index(string(body), `"system"`)
	j := strings.Index(string(body), `"messages"`)
	return i >= 0 && strings.Contains(string(body[i:max(i, j)]), "cache_control")
}

func (s *Server) proxy(w http.ResponseWriter, r *http.Request, tenant string, format upstream.Format) {
	start := time.Now()
	sh := openaiShape
	if format == upstream.Anthropic {
		sh = anthropicShape
	}
	if s.engine.Upstream.BaseURL == "" {
		writeError(w, sh, http.StatusBadGateway, "api_error", "no upstream configured: start imgctx serve with --upstream or IMGCTX_UPSTREAM_BASE_URL")
		return
	}
	if s.engine.Upstream.Format != format {
		writeError(w, sh, http.StatusNotFound, "not_found_error", "this gateway's upstream speaks "+string(s.engine.Upstream.Format)+", not "+string(format))
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		fail(w, sh, err)
		return
	}
	if body, err = s.liftInline(r.Context(), tenant, body, format); err != nil {
		s.metrics.images.WithLabelValues("refused", string(reason.Of(err))).Inc()
		fail(w, sh, err)
		return
	}
	p, err := s.decode(format, body, tenant)
	if err != nil {
		fail(w, sh, err)
		return
	}
	ctx := r.Context()
	msgs, err := s.engine.Ingest(ctx, tenant, p.msgs)
	if err != nil {
		s.metrics.images.WithLabelValues("refused", string(reason.Of(err))).Inc()
		fail(w, sh, err)
		return
	}
	profile := s.engine.Profile(p.model)
	key := tenant + "/" + r.Header.Get("X-Imgctx-Session")
	msgs = s.applyBudget(key, msgs, profile)
	msgs, removed, _ := policy.CheckProviderRules(ctx, msgs, profile.Limits, s.engine.ShrinkerFor(tenant))
	s.count(removed)
	out, err := p.encode(ctx, msgs)
	if err != nil {
		fail(w, sh, err)
		return
	}
	header := http.Header{}
	if s.cfg.PassClientKey {
		if k := r.Header.Get("X-Upstream-Api-Key"); k != "" {
			if format == upstream.Anthropic {
				header.Set("x-api-key", k)
			} else {
				header.Set("Authorization", "Bearer "+k)
			}
		}
	}
	pre := time.Since(start)
	resp, err := s.engine.Upstream.DoBody(ctx, out, header)
	var we *wire.Error
	if errors.As(err, &we) && we.Kind == wire.PromptTooLong {
		// One replay without the older images: the current message's stay.
		msgs = s.dropOlder(key, msgs)
		if out, err = p.encode(ctx, msgs); err == nil {
			resp, err = s.engine.Upstream.DoBody(ctx, out, header)
		}
		outcome := "ok"
		if err != nil {
			outcome = "failed"
		}
		s.metrics.overflow.WithLabelValues(outcome).Inc()
	}
	if err != nil {
		status := "error"
		if errors.As(err, &we) {
			status = http.StatusText(we.Status)
		}
		s.metrics.upstream.WithLabelValues(string(format), status).Inc()
		fail(w, sh, err)
		return
	}
	defer resp.Body.Close()
	s.metrics.upstream.WithLabelValues(string(format), http.StatusText(resp.StatusCode)).Inc()
	if p.stream {
		s.metrics.latency.Observe(pre.Seconds())
		s.streamThrough(w, resp, format)
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		fail(w, sh, reason.Wrap(reason.Invalid, "upstream: reading the response", err))
		return
	}
	post := time.Now()
	w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
	w.WriteHeader(resp.StatusCode)
	w.Write(b)
	s.recordUsage(format, b)
	s.metrics.latency.Observe((pre + time.Since(post)).Seconds())
}

func (s *Server) recordUsage(format upstream.Format, b []byte) {
	if format == upstream.Anthropic {
		if r, err := anthropic.DecodeResponse(b); err == nil {
			s.metrics.usage(r.Usage)
		}
		return
	}
	if r, err := openai.DecodeResponse(b); err == nil {
		s.metrics.usage(r.Usage)
	}
}

// streamThrough forwards server-sent events as they come, one flush per
// event, and records the usage they carry. A client that goes away cancels
// the request context, which stops the upstream read.
func (s *Server) streamThrough(w http.ResponseWriter, resp *http.Response, format upstream.Format) {
	for _, h := range []string{"Content-Type", "Cache-Control"} {
		if v := resp.Header.Get(h); v != "" {
			w.Header().Set(h, v)
		}
	}
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	sr := wire.NewSSEReader(resp.Body)
	var ostream openai.Stream
	var as anthropic.Stream
	for {
		ev, err := sr.Next()
		if err != nil {
			break
		}
		if _, err := w.Write(ev.Raw); err != nil {
			return // the client went away
		}
		if flusher != nil {
			flusher.Flush()
		}
		if format == upstream.Anthropic {
			_ = as.Add(ev.Name, ev.Data)
		} else {
			_ = ostream.Add(ev.Data)
		}
	}
	if format == upstream.Anthropic {
		s.metrics.usage(as.Response().Usage)
	} else {
		s.metrics.usage(ostream.Response().Usage)
	}
}

func (s *Server) count(removed []policy.Removal) {
	for _, r := range removed {
		s.metrics.images.WithLabelValues("removed", string(r.Reason)).Inc()
	}
}

// lastUser is the index of the last user message: its images are the
// request's own and are not history.
func lastUser(msgs []chat.Message) int {
	for i := len(msgs) - 1; i >= 0; i-- {
		if msgs[i].Role == chat.User {
			return i
		}
	}
	return len(msgs)
}

// asKept marks history images (before the last user message) as kept at
// their estimated cost, so the policy's eviction can rank and remove them;
// images removed before in the same session become markers again first.
func (s *Server) asKept(key string, msgs []chat.Message, p tokens.Profile) ([]chat.Message, int) {
	s.mu.Lock()
	gone := s.stable[key]
	s.mu.Unlock()
	last := lastUser(msgs)
	total := 0
	out := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		if i >= last {
			out[i] = m
			continue
		}
		m = m.Clone()
		mark := func(parts []chat.Part) {
			for j, q := range parts {
				img, ok := q.(chat.Image)
				if !ok {
					continue
				}
				if gone[img.Ref.String()] {
					mk, _ := chat.MarkerFor(img, string(reason.Budget))
					parts[j] = mk
					continue
				}
				cost, err := tokens.ImageTokens(p, img.Width, img.Height, img.Detail)
				if err != nil {
					cost = tokens.DefaultImageTokenEstimate
				}
				img.Keep, img.Cost = chat.Kept, cost
				total += cost
				parts[j] = img
			}
		}
		mark(m.Parts)
		for _, q := range m.Parts {
			if tr, ok := q.(chat.ToolResult); ok {
				mark(tr.Parts)
			}
		}
		out[i] = m
	}
	return out, total
}

// remember records removed refs for the session, so a removed image stays
// removed at the same place in later requests.
func (s *Server) remember(key string, removed []policy.Removal) {
	if len(removed) == 0 || strings.HasSuffix(key, "/") {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stable[key] == nil {
		if len(s.stable) > 100_000 { // bounded: forget everything rather than grow without end
			s.stable = map[string]map[string]bool{}
		}
		s.stable[key] = map[string]bool{}
	}
	for _, r := range removed {
		s.stable[key][r.Ref.String()] = true
	}
}

// applyBudget removes history images past the image budget, oldest first,
// in one batch down to the low-water mark, as markers with reason budget.
func (s *Server) applyBudget(key string, msgs []chat.Message, p tokens.Profile) []chat.Message {
	marked, total := s.asKept(key, msgs, p)
	budget := int(s.cfg.ImageBudgetFraction * float64(p.ContextWindow))
	out, removed, _ := policy.EvictImages(marked, policy.Pressure{Estimate: total, Threshold: budget}, reason.Budget)
	s.remember(key, removed)
	s.count(removed)
	return out
}

// dropOlder replaces every history image by a marker (reason overflow).
func (s *Server) dropOlder(key string, msgs []chat.Message) []chat.Message {
	marked, _ := s.asKept(key, msgs, tokens.Profile{Image: tokens.ImageRule{Rule: "fixed", Tokens: 1}})
	out, removed := policy.RemoveKept(marked, reason.Overflow)
	s.remember(key, removed)
	s.count(removed)
	return out
}
