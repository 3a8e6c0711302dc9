package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// MaxModelName bounds a model name: no provider has a longer one, and the
// name reaches logs and routing.
const MaxModelName = 256

// ProxyCall is one drop-in request as the gateway hands it over: the raw
// body and its wire, and the upstream request as the gateway forwards it.
// The engine does everything from there.
type ProxyCall struct {
	Tenant string
	Wire   *wire.Dialect
	Body   []byte
	// Header is the client's headers: agents name their conversations there.
	Header http.Header
	// Upstream is the request as it is forwarded (path, query, headers,
	// key); the engine writes its body.
	Upstream upstream.Request
	// Routes are the upstreams, picked by the wire's format and the model.
	Routes []*Route
	// Keep is the conversation's keep-turn-images switch. Side marks a
	// request that records nothing (a token count, a compaction): it gets
	// the images the conversation's next request would get.
	Keep, Side bool
	// Readers, when set, counts the upstream's readers of Body, so that its
	// memory is reused only once they are done; a Handover's may be taken
	// over by the conversation's next request (Arriving.Take).
	Readers wire.Readers
	// Arriving, when set, compared Body with the conversation's previous
	// request as it was read (Engine.Arriving); Proxy releases it.
	Arriving *Arriving
	// Early, when set, is the request already on its way with Body's bytes
	// as they arrived: the first attempt finishes it if the decided body
	// is Body as it is, else abandons it. The caller abandons it in any
	// case once Proxy returns.
	Early *upstream.Early
	// Recall gives each image marker a handle the model can pass to the
	// recall tool (docs/api.md "Recall").
	Recall bool
	// MaxMessages and MaxParts bound the request (0: none);
	// MaxResponseBytes what is read of a flat backend's answer.
	MaxMessages, MaxParts int
	MaxResponseBytes      int64
}

// Proxied is a drop-in request sent: the upstream's answer to relay, or
// the answer imgctx made itself, and how to read it. Close it in every
// case: it records the conversation's decisions.
type Proxied struct {
	// Response is the upstream's answer, its body open; nil with Reply.
	Response *http.Response
	// Reply is an answer imgctx gives itself: a token count the upstream
	// has no endpoint for, a flat backend's answer in the client's wire.
	Reply  *Reply
	Counts ProxyCounts
	// Conversation is the conversation's key, Upstream the route's name.
	Conversation, Model, Upstream string

	profile     tokens.Profile // prices the usage
	outlineFrom int            // the first message not the previous request's
	outline     []session.Folded
	flat        []session.ImageFate // a flat backend's: its image list, then what it left out
	fw          *proxyTurn
	sent        []chat.Message // what the last attempt sent
	wire        *wire.Dialect
	stream      bool
	strip       bool // the client did not ask for the usage event imgctx asked for
}

// Reply is an answer imgctx writes itself.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
	Usage  *chat.Usage // what the upstream reported, if it was called
}

// ProxyCounts is what one proxied request did, for metrics.
type ProxyCounts struct {
	Scanned, Resumed int // messages read, and taken over from the conversation's previous request
	Stored           int // images and documents stored anew
	StoredBytes      int64
	Deduplicated     int // re-sent inline images recognised, not stored again
	Sent, Shrunk     int
	NotSent          map[reason.Code]int
	// Overflow is the prompt-too-long replay's outcome: "", "ok" or "failed".
	Overflow string
	// Before is the engine's own time before the upstream was called.
	Before time.Duration
	// Files API (upstreams[].file_ids): images sent by file id, files
	// uploaded, uploads that failed (base64 instead), files the provider
	// no longer had (uploaded again and the request replayed), and whether
	// a quota had uploads off for the credential.
	FilesSent, FilesUploaded, FileFallbacks, FilesMissing int
	FilesOff                                              bool
}

// Proxy serves one drop-in request: the body is read in place (its wire's
// Scan), its images and documents stored once by ref, the turn model and
// the provider's rules applied to them, and the request sent on with only
// those parts rewritten (wire.Splice). Everything else — other blocks,
// roles, fields, the query, the client's headers — goes upstream as it
// came; a prompt-too-long is replayed once without the images that can go.
func (e *Engine) Proxy(ctx context.Context, c ProxyCall) (*Proxied, error) {
	defer c.Arriving.Release() // the scan's, unless it never ran
	e.once.Do(e.init)
	if e.invalid != nil {
		return nil, e.invalid
	}
	start := time.Now()
	d := c.Wire
	_, scanned := startSpan(ctx, "imgctx.scan")
	sp, keys, rk, prev, err := e.scan(c)
	if sp != nil && scanned.IsRecording() {
		scanned.SetAttributes(attribute.Int("imgctx.messages", len(sp.Marks)), attribute.Int("imgctx.messages.resumed", sp.Resumed),
			attribute.Int("imgctx.slots", len(sp.Slots)))
	}
	scanned.End()
	if err != nil {
		return nil, err
	}
	counts := ProxyCounts{Scanned: len(sp.Marks) - sp.Resumed, Resumed: sp.Resumed, NotSent: map[reason.Code]int{}}
	if len(sp.Model) > MaxModelName {
		return nil, reason.New(reason.Invalid, fmt.Sprintf("model name of %d bytes: the limit is %d", len(sp.Model), MaxModelName))
	}
	route, err := Pick(c.Routes, d, sp.Model)
	if err != nil {
		return nil, err
	}
	if route.Client.Format.Flat() {
		key, _ := conversationKey(c.Tenant, d, conversationID(c.Header, sp), sp)
		return e.flat(ctx, c, key, sp.Model, route, counts)
	}
	ictx, ingested := startSpan(ctx, "imgctx.ingest")
	in, err := e.ingestSlots(ictx, c.Tenant, sp, keys, prev.filled, &counts)
	if ingested.IsRecording() {
		ingested.SetAttributes(attribute.Int("imgctx.images.stored", counts.Stored), attribute.Int64("imgctx.images.stored_bytes", counts.StoredBytes),
			attribute.Int("imgctx.images.deduplicated", counts.Deduplicated))
	}
	ingested.End()
	if err != nil {
		e.sink(Event{Kind: "refused", Reason: reason.Of(err)})
		return nil, err
	}
	id := conversationID(c.Header, sp)
	key, opening := prev.convKey, prev.opening
	if key == "" || prev.convID != id || sp.Resumed < opening {
		key, opening = conversationKey(c.Tenant, d, id, sp)
	}
	res, held := holdResume(&c, sp)
	sent := new(atomic.Pointer[sentAs])
	applied := new(atomic.Pointer[[]chat.Message])
	e.spans.keepResume(rk, resumed{res: res, held: held, keys: in.keys, filled: in.filled, applied: applied, convKey: key, convID: id, opening: opening, sent: sent})
	profile := e.ProfileWith(sp.Model, route.Hints)
	files := e.fileSenderFor(c, route, &counts)
	dctx, decided := startSpan(ctx, "imgctx.decide")
	fw, err := e.decide(dctx, proxyRequest{Tenant: c.Tenant, Key: key,
		Model: sp.Model, Profile: profile, Messages: in.msgs, Prior: prev.appliedTo(in.from), Compacted: sp.Compacted(), Keep: c.Keep, Bytes: int64(len(c.Body)),
		Text: textOf(d, sp, profile), Estimate: estimateOf(sp), Files: files != nil})
	if fw != nil && decided.IsRecording() {
		decided.SetAttributes(attribute.Int("imgctx.images.not_sent", len(fw.NotSent)))
	}
	decided.End()
	if err != nil {
		return nil, err
	}
	if fw.applied != nil {
		applied.Store(&fw.applied)
	}
	if c.Side {
		fw.Discard()
	}
	p := &Proxied{fw: fw, wire: d, stream: sp.Stream, Counts: counts, Conversation: key, Model: sp.Model, Upstream: route.Name, profile: profile,
		outlineFrom: sp.Resumed, outline: outlineOf(sp, sp.Resumed)}
	if files != nil {
		files.counts = &p.Counts
	}
	var edits []wire.Edit
	if d.AskUsage != nil && sp.Stream {
		var ed *wire.Edit
		if ed, p.strip = d.AskUsage(sp); ed != nil {
			edits = append(edits, *ed)
		}
	}
	req := c.Upstream
	// rules and shrunk are the last attempt's: what it did not send for a
	// provider rule, and how many it shrank.
	var rules []policy.Removal
	var shrunk int
	send := func() (*http.Response, error) {
		out, removed, resized, err := e.meetRules(ctx, c.Tenant, fw.Messages, profile.Limits)
		if err != nil {
			return nil, err
		}
		rules, shrunk = removed, len(resized)
		if c.Recall {
			out = fw.recallable(ctx, out)
		}
		p.sent = out
		body, err := e.splice(ctx, c.Tenant, d, sp, in.verbatim, in.msgs, out, edits, files, fw.FilesFrom())
		if err != nil {
			return nil, err
		}
		sent.Store(sentAsOf(body, c.Body))
		req.Body = body
		req.Early, c.Early = c.Early, nil // the first attempt's, if any
		req.Header = files.header(c.Upstream.Header)
		if c.Readers != nil {
			req.Body = body.Tracked(c.Readers)
		}
		var opts []trace.SpanStartOption
		if trace.SpanFromContext(ctx).IsRecording() { // built only for a span that keeps them
			opts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(attribute.String("imgctx.upstream", route.Name), attribute.Int("http.request.body.size", body.Len()))}
		}
		uctx, call := startSpan(ctx, "imgctx.upstream", opts...)
		defer call.End()
		if call.SpanContext().SpanID() != trace.SpanContextFromContext(ctx).SpanID() {
			// A span of ours (untraced, the client's traceparent passes as it came).
			req.Header = req.Header.Clone()
			traceContext.Inject(uctx, propagation.HeaderCarrier(req.Header))
		}
		resp, err := route.Client.Send(uctx, req)
		var we *wire.Error
		status := 0
		switch {
		case err == nil:
			status = resp.StatusCode
		case errors.As(err, &we):
			status = we.Status
			call.SetStatus(codes.Error, http.StatusText(we.Status))
		default:
			call.SetStatus(codes.Error, "upstream unreachable")
		}
		if status != 0 && call.IsRecording() {
			call.SetAttributes(attribute.Int("http.response.status_code", status))
		}
		return resp, err
	}
	p.Counts.Before = time.Since(start)
	// Above the dial's default the user pays to see more: the client's
	// compaction, put off by imgctx's removals, is how more stays in sight
	// (the dial at 2 held 51.5 screenshots a request on computer-use where
	// refusing capped every position at 46.8), so it is not brought back.
	if e.ProxyClientWindow && e.Keep.Sight <= policy.DefaultSight && d.TooLong != nil { // off, the images are not walked again
		if n, past := fw.PastClientWindow(); past {
			// The client's own history is past the window: refused as the
			// provider would have, so the client compacts where it would have.
			typ, msg := d.TooLong(n, profile.ContextWindow)
			body, _ := json.Marshal(d.ErrorBody(http.StatusBadRequest, typ, msg))
			e.log().InfoContext(ctx, "proxy: refused as the provider would have: the client's history is past the window", "tenant", c.Tenant, "model", clip(sp.Model), "prompt", n, "window", profile.ContextWindow)
			p.close(ctx)
			return nil, d.DecodeError(http.StatusBadRequest, http.Header{"Content-Type": {"application/json"}}, body)
		}
	}
	resp, err := send()
	if files.missing(ctx, err) {
		// A file the provider no longer has: uploaded again, sent again.
		resp, err = send()
	}
	var we *wire.Error
	tooLong := errors.As(err, &we) && we.Kind == wire.PromptTooLong
	if tooLong && fw.compacts {
		fw.left = true // an estimate past the window the provider took says nothing of the client
		e.log().InfoContext(ctx, "proxy: the window's refusal left to the client, whose compaction costs less than relieving it", "tenant", c.Tenant, "model", clip(sp.Model), "messages", len(fw.Messages))
	}
	if tooLong && fw.Overflow() {
		// Replay once, without the kept images and the user's older
		// ones: a body that differs. With nothing left to remove the
		// upstream's error is the answer at once.
		resp, err = send()
		p.Counts.Overflow = "ok"
		if err != nil {
			p.Counts.Overflow = "failed"
		}
	}
	p.countSent(rules, shrunk)
	e.logRemovals(ctx, c.Tenant, sp.Model, fw)
	if c.Side && d.CountAnswer != nil && strings.HasSuffix(req.Path, d.CountPath) && errors.As(err, &we) && (we.Status == http.StatusNotFound || we.Status == http.StatusMethodNotAllowed) {
		// The upstream has no token-count endpoint: imgctx's own estimate
		// of the request it would send, said as such.
		n := estimateOf(sp)(0)
		for _, m := range fw.Messages {
			for _, img := range m.Images() {
				if t, err := tokens.ImageTokens(profile, img.Width, img.Height, img.Detail); err == nil {
					n += t
				}
			}
		}
		p.Reply = jsonReply(d.CountAnswer(n), nil)
		p.Reply.Header.Set("X-Imgctx-Token-Count", "estimated")
		return p, nil
	}
	if err != nil {
		p.close(ctx)
		return nil, err
	}
	p.Response = resp
	return p, nil
}

// scan reads the body in place, from where the conversation's previous
// request parts from it, hashing inline spans as it goes. It returns the
// view, each slot's span key, the conversation's resume key, and what was
// kept of its previous request.
func (e *Engine) scan(c ProxyCall) (*wire.Spliced, []*spanKey, resumeKey, resumed, error) {
	rk := e.spans.resumeKeyOf(c.Tenant, c.Wire.Name, c.Header, c.Body)
	prev, known, done := e.resumeFrom(rk, c.Arriving)
	found, hashed := e.spans.hashAhead(c.Tenant, c.Body)
	sp, err := c.Wire.Scan(c.Body, wire.ScanOptions{Prev: prev.res, Known: known, Found: found, MaxMessages: c.MaxMessages, MaxParts: c.MaxParts})
	done() // the previous request's bytes are compared
	if err != nil {
		hashed(nil)
		var tooMany *wire.TooMany
		if errors.As(err, &tooMany) {
			return nil, nil, rk, prev, reason.New(reason.TooLarge, tooMany.Error()+" (server.max_messages, server.max_parts)")
		}
		return nil, nil, rk, prev, reason.Wrap(reason.Invalid, "malformed request", err)
	}
	// The slots taken over from the previous request come first, with the
	// keys that request found for them.
	taken := 0
	if len(sp.Marks) > 0 && sp.Resumed > 0 {
		taken = slotsBefore(sp, sp.Resumed)
	}
	keys := append(append([]*spanKey(nil), prev.keys[:taken]...), hashed(sp.Slots[taken:])...)
	if c.Wire.FromPath != nil {
		c.Wire.FromPath(c.Upstream.Path, sp)
	}
	return sp, keys, rk, prev, nil
}

// holdResume is what the next request of the conversation resumes from,
// holding this request's memory to compare it with (wire.Resume): the
// caller's buffer, counted as one more reader until the resume lets it
// go, or a copy when the caller does not count readers.
func holdResume(c *ProxyCall, sp *wire.Spliced) (*wire.Resume, *heldBody) {
	res := sp.Resume()
	if c.Readers == nil {
		res.Body = bytes.Clone(res.Body)
		return res, nil
	}
	c.Readers.Add(1)
	h := &heldBody{release: c.Readers.Done}
	if o, ok := c.Readers.(Handover); ok {
		h.take = func() bool { return o.Take(res.Body) }
	}
	return res, h
}

// Handover is Readers whose buffer the conversation's next request may
// read its own body into (Arriving.Take): Take succeeds when b starts the
// buffer and the one reader left is the resume holding it; the buffer is
// the taker's from then on, and the resume's Done is never called.
type Handover interface {
	wire.Readers
	Take(b []byte) bool
}

// Streams reports whether the answer is a stream, to Relay event by event.
func (p *Proxied) Streams() bool {
	return p.Response != nil && p.stream && strings.HasPrefix(p.Response.Header.Get("Content-Type"), "text/event-stream")
}

// Relay writes a streamed answer's events to w as they come, calling flush
// after each, and measures the usage they carry: it returns it, nil when
// the stream was cut off or the client went away (a client that goes
// away cancels the request, which stops the upstream read). The usage-only
// event imgctx asked for and the client did not is kept from it.
func (p *Proxied) Relay(w io.Writer, flush func()) *chat.Usage {
	sr := wire.NewSSEReader(p.Response.Body)
	events := p.wire.NewStream()
	for {
		ev, err := sr.Next()
		if err != nil {
			break
		}
		if events.Add(ev, p.strip) {
			continue
		}
		if _, err := w.Write(ev.Raw); err != nil {
			return nil // the client went away: nothing to measure
		}
		flush()
	}
	u, cut, done := events.Result()
	if !done {
		return nil // cut off: no measurement
	}
	p.fw.Observe(u, cut)
	return u
}

// Read measures a whole answer of the upstream and returns its usage (nil
// for an error status).
func (p *Proxied) Read(body []byte) *chat.Usage {
	if p.Response == nil || p.Response.StatusCode/100 != 2 {
		return nil
	}
	u, cut := p.wire.Answer(body)
	p.fw.Observe(u, cut)
	return u
}

// Settle makes the request's decisions its conversation's before its
// answer is handed over (a whole answer once Read, a stream once
// relayed), so that the next request starts from them however soon it
// comes; Close then only writes them to the store (on a shared store
// Settle writes them).
func (p *Proxied) Settle(ctx context.Context) error { return p.persist(ctx, (*proxyTurn).Settle) }

// Unwritten reports whether Close has settled decisions to write to the
// session store: the only part of Close worth running behind the answer.
func (p *Proxied) Unwritten() bool { return p.fw != nil && !p.fw.closed && p.fw.unwritten }

// Close records the conversation's decisions and closes the upstream's
// answer.
func (p *Proxied) Close(ctx context.Context) error {
	if p.Response != nil {
		p.Response.Body.Close()
	}
	return p.close(ctx)
}

func (p *Proxied) close(ctx context.Context) error { return p.persist(ctx, (*proxyTurn).Close) }

// persist runs one step of recording the decisions, whatever became of
// the client's request.
func (p *Proxied) persist(ctx context.Context, step func(*proxyTurn, context.Context) error) error {
	if p.fw == nil {
		return nil
	}
	if err := step(p.fw, context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("proxy: persisting the conversation's decisions: %w", err)
	}
	return nil
}

// Images are the request's images as its last attempt sent them, in the
// client's order: each sent (under its own ref, or its shrunk copy's), or
// not sent with the reason its marker gives.
func (p *Proxied) Images() []session.ImageFate {
	if p.fw == nil {
		return p.flat
	}
	if len(p.sent) != len(p.fw.r.Messages) {
		return fatesOf(p.sent, p.profile) // nothing sent
	}
	// What was sent holds an image or its marker only where the client's
	// request held an image: only those messages are read.
	var out []session.ImageFate
	for _, i := range chat.Imaged(p.fw.r.Messages) {
		partsOf(i, p.sent[i], fateOf(&out, p.profile))
	}
	return out
}

// fatesOf lists the images of messages as they are sent: each image with
// its cost, and each image marker with its reason and caption.
func fatesOf(msgs []chat.Message, profile tokens.Profile) []session.ImageFate {
	var out []session.ImageFate
	eachPart(msgs, fateOf(&out, profile))
	return out
}

// fateOf is the fatesOf of one part, appended to out.
func fateOf(out *[]session.ImageFate, profile tokens.Profile) func(wire.Pos, chat.Part) {
	return func(at wire.Pos, part chat.Part) {
		switch q := part.(type) {
		case chat.Image:
			f := session.ImageFate{Ref: q.Ref, Msg: at.Msg, Sent: true, Keep: string(q.Keep), Width: q.Width, Height: q.Height, Tokens: q.Cost}
			if f.Tokens == 0 {
				f.Tokens, _ = tokens.ImageTokens(profile, q.Width, q.Height, q.Detail)
			}
			*out = append(*out, f)
		case chat.Marker:
			if q.Of == "image" {
				*out = append(*out, session.ImageFate{Ref: q.Ref, Msg: at.Msg, Reason: reason.Code(q.Reason), Caption: q.Caption})
			}
		}
	}
}

// outlineOf folds the messages of a scanned request from the first one on:
// each its role and its bytes, inline image data left out.
func outlineOf(sp *wire.Spliced, first int) []session.Folded {
	out := make([]session.Folded, 0, max(len(sp.Marks)-first, 0))
	for i := first; i < len(sp.Marks); i++ {
		n := sp.Marks[i].End - sp.Marks[i].Start
		for _, sl := range sp.Slots[sp.Marks[i].Slots:slotsBefore(sp, i+1)] {
			n -= sl.Data.End - sl.Data.Start
		}
		out = append(out, session.Folded{Role: string(sp.Messages[i].Role), Bytes: n})
	}
	return out
}

// Record is the request's line of the request log as the engine knows
// it, for the usage the answer reported (nil: none): the conversation,
// model and upstream, the tokens and their price, each image's fate, the
// first removals, the prefix break and the replay. The caller adds what
// HTTP knows.
func (p *Proxied) Record(u *chat.Usage) session.Request {
	r := session.Request{Conversation: p.Conversation, Model: p.Model, Upstream: p.Upstream, Images: p.Images(),
		GatewayMS: float64(p.Counts.Before.Microseconds()) / 1000, Window: p.profile.ContextWindow,
		OutlineFrom: p.outlineFrom, Outline: p.outline}
	priced(&r, p.profile, u)
	if p.fw != nil {
		r.Removed, r.Replays = countEvents(p.fw.Events)
		r.BreakCause = p.fw.Break
		r.Break = r.BreakCause != ""
	}
	return r
}

// priced puts the usage on the line, at the profile's prices.
func priced(r *session.Request, p tokens.Profile, u *chat.Usage) {
	r.Profile = p.Name
	if u == nil {
		return
	}
	r.Input, r.CacheRead, r.CacheWrite, r.Output = u.Prompt, u.CacheRead, u.CacheWrite, u.Output
	if p.Prices != nil {
		r.Dollars, r.Priced = p.Prices.Dollars(*u), true
	}
}

// countEvents counts a request's first removals and its replays.
func countEvents(evs []Event) (removed, replays int) {
	for _, ev := range evs {
		switch ev.Kind {
		case "removed":
			removed++
		case "retried":
			replays++
		}
	}
	return removed, replays
}

// countSent counts a request's images once, as its last attempt sent
// them: every one not sent with its reason (removed now or before), those
// shrunk to a provider limit, those sent.
func (p *Proxied) countSent(rules []policy.Removal, shrunk int) {
	for _, r := range append(append([]policy.Removal(nil), p.fw.NotSent...), rules...) {
		p.Counts.NotSent[r.Reason]++
	}
	p.Counts.Shrunk = shrunk
	sent := 0
	eachImage(p.fw.Messages, func(wire.Pos, chat.Image) { sent++ })
	p.Counts.Sent = sent - len(rules)
}

// logRemovals writes one line for a request that removed images.
func (e *Engine) logRemovals(ctx context.Context, tenant, model string, fw *proxyTurn) {
	by := map[reason.Code]int{}
	first := 0
	for _, ev := range fw.Events {
		if ev.Kind == "removed" {
			by[ev.Reason]++
			first++
		}
	}
	if first == 0 {
		return
	}
	attrs := []any{"tenant", tenant, "model", clip(model), "removed", first, "not_sent", len(fw.NotSent)}
	for code, n := range by {
		attrs = append(attrs, "reason_"+string(code), n)
	}
	e.log().InfoContext(ctx, "proxy: images removed", attrs...)
}

// clip bounds a client-supplied value for a log line.
func clip(s string) string {
	if len(s) <= 256 {
		return s
	}
	return fmt.Sprintf("%.256s… (%d bytes)", s, len(s))
}

func (e *Engine) sink(ev Event) {
	if e.Sink != nil {
		e.Sink(ev)
	}
}

// jsonReply is a 200 with a JSON body.
func jsonReply(v any, u *chat.Usage) *Reply {
	b, _ := wire.Marshal(v)
	return &Reply{Status: http.StatusOK, Header: http.Header{"Content-Type": {"application/json"}}, Body: append(b, '\n'), Usage: u}
}

// textOf counts what messages[from:] of a proxied request bill as text: each
// is decoded from its own bytes (the view carries no text), its inline
// base64 left out (textBytes), its text counted with the profile's
// tokenizer, plus each message's framing.
func textOf(d *wire.Dialect, sp *wire.Spliced, p tokens.Profile) func(int) int {
	decode := d.DecodeMessage
	counter := tokens.CounterFor(p.Tokenizer)
	return func(from int) int {
		n := 0
		var buf []byte
		for i := min(from, len(sp.Marks)); i < len(sp.Marks); i++ {
			n += tokens.MessageFraming
			var raw []byte
			raw, buf = textBytes(sp, i, buf)
			msgs, err := decode(raw)
			if err != nil {
				continue // the scan read it; a codec it does not suit counts nothing
			}
			for _, dm := range msgs {
				n += policy.TextTokens(dm.Parts, counter)
			}
		}
		return n
	}
}

// dataStandIn replaces an inline image's or document's base64 in the bytes
// decoded for their text: valid base64 every dialect's decoder takes.
const dataStandIn = "AAAA"

// textBytes is message i's bytes with the inline base64 of its images and
// documents replaced by dataStandIn, in buf (reused): they bill no text,
// and decoding a screenshot's megabyte to read the text around it scanned
// it several times over — milliseconds on every request that brought one.
func textBytes(sp *wire.Spliced, i int, buf []byte) (raw, next []byte) {
	m := sp.Marks[i]
	at := m.Start
	for _, sl := range slotsOf(sp, i) {
		if d := sl.Data; d.End > d.Start && d.Start >= at && d.End <= m.End {
			if at == m.Start {
				buf = buf[:0]
			}
			buf = append(append(buf, sp.Body[at:d.Start]...), dataStandIn...)
			at = d.End
		}
	}
	if at == m.Start {
		return sp.Body[m.Start:m.End], buf
	}
	buf = append(buf, sp.Body[at:m.End]...)
	return buf, buf
}

// slotsOf is the slots of message i.
func slotsOf(sp *wire.Spliced, i int) []wire.Slot {
	return sp.Slots[slotsBefore(sp, i):slotsBefore(sp, i+1)]
}

// estimateOf estimates the text of messages[from:] from their bytes, the
// inline image data left out, at four characters a token.
func estimateOf(sp *wire.Spliced) func(int) int {
	return func(from int) int {
		if from >= len(sp.Marks) {
			return 0
		}
		n := sp.Marks[len(sp.Marks)-1].End - sp.Marks[from].Start
		for _, sl := range sp.Slots[sp.Marks[from].Slots:] {
			n -= sl.Data.End - sl.Data.Start
		}
		return n/tokens.CharsPerToken + tokens.MessageFraming*(len(sp.Marks)-from)
	}
}

// slotsBefore is how many of sp's slots lie in its first n messages.
func slotsBefore(sp *wire.Spliced, n int) int {
	if n < len(sp.Marks) {
		return sp.Marks[n].Slots
	}
	return len(sp.Slots)
}

// ingested is a request's slots read, checked and filled in.
type ingested struct {
	msgs []chat.Message // the view with each slot filled in
	// filled is msgs with room behind it for the conversation's next
	// request to extend (nil with no slot); its first from messages are
	// the previous request's, taken over.
	filled []chat.Message
	from   int
	// verbatim says for each slot whether its bytes can go upstream as
	// they came (inline standard base64); keys are the slots' span keys
	// (nil where there is none), for the next request.
	verbatim []bool
	keys     []*spanKey
}

// ingestSlots reads every image and document of the request — a re-sent
// one only recognised, a new one decoded and checked, in parallel (that
// work is CPU-bound and independent per image) — and, once every one is
// accepted, stores the new ones by ref: a refused request stores nothing.
// prev is the previous request's filled view, which this one extends
// when its scan extended that request's view.
func (e *Engine) ingestSlots(ctx context.Context, tenant string, sp *wire.Spliced, keys []*spanKey, prev []chat.Message, counts *ProxyCounts) (ingested, error) {
	read := make([]checked, len(sp.Slots))
	errs := make([]error, len(sp.Slots))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, slot := range sp.Slots {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			var key *spanKey
			if i < len(keys) {
				key = keys[i]
			}
			read[i], errs[i] = e.readSlot(ctx, tenant, sp.Body, slot, key)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return ingested{}, err
	}
	// The view's messages are shared with the conversation's next scan:
	// with no slot the view is taken as it is (the policies copy what they
	// change), capped so that nothing appends into the next scan's room.
	if len(sp.Slots) == 0 {
		return ingested{msgs: sp.Messages[:len(sp.Messages):len(sp.Messages)]}, nil
	}
	// The slots are filled in a copy: only a message a slot is put in is
	// copied whole (slots come in message order). A scan that extends the
	// previous request's view in place (the one scan that may) extends
	// that request's filled view the same way, past what its readers read:
	// its messages are those bytes, filled in with the same images, and
	// the history is not copied. Any other request copies the view.
	filled, from := prev, len(prev)
	if !sp.Extends || from != sp.Resumed || from == 0 {
		filled, from = withRoom(sp.Messages), 0
	} else {
		filled = append(filled, sp.Messages[from:]...)
	}
	owned := -1
	own := func(i int) {
		if i > owned {
			filled[i], owned = filled[i].Clone(), i
		}
	}
	// Images first, origins after: whether a user message only carries a
	// tool's images depends on all of its parts.
	var toolEcho []int
	verbatim := make([]bool, len(sp.Slots))
	found := make([]*spanKey, len(sp.Slots))
	for i, slot := range sp.Slots {
		in := read[i].in
		stored, err := e.commit(ctx, tenant, read[i])
		switch {
		case err != nil:
			if slot.Pos.Nested < 0 || slot.Kind != "image" || !read[i].canonical {
				return ingested{}, reason.Wrap(reason.Refused, "the image store refused an image", err)
			}
			// Seed keep-turn-images, "rangement refusé": a tool image the
			// store refuses goes on as it came, ephemeral (relaying it
			// finds it unstored and stops keeping for the turn).
			e.log().WarnContext(ctx, "the image store refused a tool image: it is sent as it came, this turn only", "err", err)
		case stored:
			counts.Stored++
			counts.StoredBytes += in.Bytes
		case slot.Via == "base64":
			counts.Deduplicated++ // re-sent: recognised, not stored again
		}
		verbatim[i], found[i] = read[i].canonical, read[i].key
		if slot.Pos.Msg < from {
			continue // filled in by the previous request, with these bytes
		}
		own(slot.Pos.Msg)
		if slot.Kind == "document" {
			wire.Put(filled, slot.Pos, chat.Document{Ref: in.Ref, MediaType: in.MediaType, Pages: in.Pages})
			continue
		}
		origin := chat.FromUser
		if slot.Pos.Nested >= 0 || filled[slot.Pos.Msg].Role == chat.Tool {
			// Inside a tool result, or beside one in the tools' answer
			// (gemini-cli puts a screenshot next to its functionResponse).
			origin = chat.FromTool
		} else {
			toolEcho = append(toolEcho, i)
		}
		wire.Put(filled, slot.Pos, chat.Image{Ref: in.Ref, MediaType: in.MediaType, Bytes: in.Bytes, Width: in.Width, Height: in.Height,
			Detail: slot.Detail, Origin: origin})
	}
	for _, i := range toolEcho {
		// RelaysTool reads the messages before: a filled message's origins
		// never change as the history grows.
		if at := sp.Slots[i].Pos; chat.RelaysTool(filled, at.Msg) {
			img := wire.At(filled, at).(chat.Image)
			img.Origin = chat.FromTool
			wire.Put(filled, at, img)
		}
	}
	return ingested{msgs: filled[:len(filled):len(filled)], filled: filled, from: from, verbatim: verbatim, keys: found}, nil
}

// foldRelays returns the edits that write the markers of a message
// relaying a tool's images into the tool message before it
// (wire.Dialect.FoldRelay), and the messages they leave out: a user
// message right after one tool message — after several, which tool each
// marker stands for would be lost —, every part of it a marker.
func foldRelays(d *wire.Dialect, sp *wire.Spliced, out []chat.Message) ([]wire.Edit, map[int]bool) {
	if d.FoldRelay == nil {
		return nil, nil
	}
	var edits []wire.Edit
	var gone map[int]bool
	last := -1
	for _, slot := range sp.Slots {
		i := slot.Pos.Msg
		if i == last || slot.Pos.Nested >= 0 {
			continue
		}
		last = i
		if i < 1 || i >= len(sp.Marks) || out[i].Role != chat.User || out[i-1].Role != chat.Tool || i >= 2 && out[i-2].Role == chat.Tool {
			continue
		}
		texts := make([]string, 0, len(out[i].Parts))
		for _, p := range out[i].Parts {
			m, ok := p.(chat.Marker)
			if !ok {
				texts = nil
				break
			}
			texts = append(texts, m.String())
		}
		if len(texts) == 0 {
			continue
		}
		if e := d.FoldRelay(sp.Body, sp.Marks[i-1], sp.Marks[i], strings.Join(texts, " ")); e != nil {
			edits = append(edits, e...)
			if gone == nil {
				gone = map[int]bool{}
			}
			gone[i] = true
		}
	}
	return edits, gone
}

// readSlot reads one slot: inline base64, or a ref or URL resolved (refs
// tenant-checked, URLs through the SSRF guard).
func (e *Engine) readSlot(ctx context.Context, tenant string, body []byte, slot wire.Slot, key *spanKey) (checked, error) {
	var l checked
	var err error
	if slot.Via == "base64" {
		l, err = e.liftBase64(ctx, tenant, slot.Data.Of(body), slot.MediaType, key)
	} else {
		l.data, l.in, err = e.Resolve(ctx, tenant, slot.URL)
	}
	if err != nil {
		return checked{}, err
	}
	if slot.Kind == "image" && l.in.Kind != media.KindImage {
		return checked{}, reason.New(reason.Invalid, l.in.MediaType+" sent as an image")
	}
	return l, nil
}

// splice writes the request for the upstream: each slot as the policies
// left it (unchanged inline data as it came; a ref expanded; a shrunk copy
// with its resize note; a marker as text), plus edits at the top level.
//
// With files (upstreams[].file_ids), the images of messages from filesFrom
// on go as references to the provider's files, uploaded first where the
// provider has none; an image whose upload failed goes as base64.
func (e *Engine) splice(ctx context.Context, tenant string, d *wire.Dialect, sp *wire.Spliced, verbatim []bool, in, out []chat.Message, edits []wire.Edit,
	files *fileSender, filesFrom int) (wire.Body, error) {
	edits = append([]wire.Edit(nil), edits...)
	src := e.ImageSource(ctx, tenant)
	source := func(slot wire.Slot, mediaType, b64 string) wire.Edit {
		return wire.Edit{Start: slot.Source.Start, End: slot.Source.End, Write: func(w *wire.BodyWriter) { d.WriteSource(w, mediaType, b64) }}
	}
	byFile := func(slot wire.Slot) bool { return files != nil && slot.Kind == "image" && slot.Pos.Msg >= filesFrom }
	if files != nil {
		files.sent = files.sent[:0]
		var imgs []chat.Image
		for _, slot := range sp.Slots {
			if img, ok := wire.At(out, slot.Pos).(chat.Image); ok && byFile(slot) {
				imgs = append(imgs, img)
			}
		}
		files.prepare(ctx, imgs)
	}
	folded, gone := foldRelays(d, sp, out)
	edits = append(edits, folded...)
	for i, slot := range sp.Slots {
		if gone[slot.Pos.Msg] {
			continue
		}
		before, after := wire.At(in, slot.Pos), wire.At(out, slot.Pos)
		switch p := after.(type) {
		case chat.Image:
			was, _ := before.(chat.Image)
			ed, byID := wire.Edit{}, false
			if byFile(slot) {
				ed, byID = files.edit(sp.Body, slot, p)
			}
			if !byID && p.Ref == was.Ref && verbatim[i] {
				continue // sent as it came
			}
			if !byID {
				mt, b64, _, err := src(p)
				if err != nil {
					return wire.Body{}, err
				}
				ed = source(slot, mt, b64)
			}
			edits = append(edits, ed)
			if p.Ref != was.Ref && was.Width > 0 {
				note := policy.ResizeNote(was.Width, was.Height, p.Width, p.Height)
				edits = append(edits, wire.Edit{Start: slot.Part.End, End: slot.Part.End, Write: func(w *wire.BodyWriter) {
					w.WriteByte(',')
					d.WriteText(w, note, nil)
				}})
			}
		case chat.Document:
			if verbatim[i] {
				continue
			}
			b64, err := e.Base64(ctx, tenant, p.Ref)
			if err != nil {
				return wire.Body{}, err
			}
			edits = append(edits, source(slot, p.MediaType, b64))
		case chat.Marker:
			text, cache := p.String(), slot.Cache.Of(sp.Body)
			edits = append(edits, wire.Edit{Start: slot.Part.Start, End: slot.Part.End, Write: func(w *wire.BodyWriter) {
				d.WriteText(w, text, cache)
			}})
		default:
			return wire.Body{}, errors.New("splice: a managed part changed kind")
		}
	}
	return wire.Splice(sp.Body, edits)
}
