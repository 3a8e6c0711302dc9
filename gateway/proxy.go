package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// maxModelName bounds a model name: no provider has a longer one, and the
// name reaches logs and routing.
const maxModelName = 256

func shapeOf(format upstream.Format) shape {
	switch format {
	case upstream.Anthropic:
		return anthropicShape
	case upstream.Gemini:
		return geminiShape
	}
	return openaiShape
}

// hashAhead names each inline base64 span by its hash while the scan goes
// on (a re-sent image is then recognised at once): it returns the hook for
// the scan and a wait that gives the keys of the slots the scan kept, in
// their order (nil where a slot is not inline). A scanner may drop a slot
// it reported (a block type found to be the provider's), so keys are
// matched to slots by where their data starts. Nothing is decoded or
// stored before the scan succeeds.
func (s *Server) hashAhead(tenant string, body []byte) (func(wire.Slot), func([]wire.Slot) []*spanKey) {
	keys := map[int]*spanKey{}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	found := func(sl wire.Slot) {
		data := sl.Data.Of(body)
		if sl.Via != "base64" || len(data) < 4096 {
			return
		}
		k := new(spanKey)
		keys[sl.Data.Start] = k
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			*k = s.spanKeyOf(tenant, data)
		})
	}
	return found, func(slots []wire.Slot) []*spanKey {
		wg.Wait()
		out := make([]*spanKey, len(slots))
		for i, sl := range slots {
			if sl.Via == "base64" {
				out[i] = keys[sl.Data.Start]
			}
		}
		return out
	}
}

// proxy serves a drop-in route: the body is read in place (wire.Spliced),
// its images and documents stored once by ref, the budget and provider
// rules applied to them, and the request sent on with only those parts
// rewritten. Everything else — other blocks, roles, fields, the query,
// the client's headers — goes upstream as it came, and the upstream's
// answer (headers, status, body, stream) comes back as it came.
//
// A side request (record false: a token count, a compaction) gets the
// images the conversation's next request would get and records nothing.
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, tenant string, d *dialect, record bool) {
	start := time.Now()
	sh := d.shape
	body, err := s.readBodyInto(r, s.bodies.get)
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	// The body goes back to the pool once this handler and every upstream
	// reader of it are done: the view and the request share its memory.
	var readers sync.WaitGroup
	if s.bodies.pooled(body) {
		defer func() {
			go func() {
				readers.Wait()
				s.bodies.put(body)
			}()
		}()
	}
	rk := s.resumeKeyOf(tenant, d.Name, r.Header, body)
	prev := s.resumeFor(rk)
	found, hashed := s.hashAhead(tenant, body)
	sp, err := d.Scan(body, wire.ScanOptions{Prev: prev.res, Found: found, MaxMessages: s.cfg.MaxMessages, MaxParts: s.cfg.MaxParts})
	var keys []*spanKey
	if err == nil {
		// The slots taken over from the previous request come first, with
		// the keys that request found for them.
		taken := 0
		if len(sp.Marks) > 0 && sp.Resumed > 0 {
			taken = slotsBefore(sp, sp.Resumed)
		}
		keys = append(append([]*spanKey(nil), prev.keys[:taken]...), hashed(sp.Slots[taken:])...)
	} else {
		hashed(nil)
	}
	if err == nil && d.fromPath != nil {
		d.fromPath(r, sp)
	}
	var tooMany *wire.TooMany
	if errors.As(err, &tooMany) {
		s.fail(w, sh, reason.New(reason.TooLarge, tooMany.Error()+" (server.max_messages, server.max_parts)"))
		return
	}
	if err != nil {
		s.fail(w, sh, reason.Wrap(reason.Invalid, "malformed request", err))
		return
	}
	s.metrics.scanned.WithLabelValues("resumed").Add(float64(sp.Resumed))
	s.metrics.scanned.WithLabelValues("scanned").Add(float64(len(sp.Marks) - sp.Resumed))
	if len(sp.Model) > maxModelName {
		s.fail(w, sh, reason.New(reason.Invalid, fmt.Sprintf("model name of %d bytes: the limit is %d", len(sp.Model), maxModelName)))
		return
	}
	up, err := s.pick(d.format, sp.Model)
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	if up.Client.Format.Flat() {
		s.flat(w, r, tenant, d, body, sp.Model, up, record)
		return
	}
	ctx := r.Context()
	msgs, asIs, keys, err := s.ingestSlots(ctx, tenant, sp, keys)
	if err != nil {
		s.metrics.images.WithLabelValues("refused", string(reason.Of(err))).Inc()
		s.fail(w, sh, err)
		return
	}
	s.keepResume(rk, resumed{res: sp.Resume(), keys: keys})
	profile := s.engine.ProfileWith(sp.Model, up.Hints)
	fw, err := s.engine.Forward(ctx, engine.ProxyRequest{Tenant: tenant, Key: conversationKey(tenant, d.Name, r.Header, sp),
		Model: sp.Model, Profile: profile, Messages: msgs, Compacted: sp.Compacted(), Keep: s.keepFor(r), Bytes: int64(len(body)),
		Text: textOf(d, sp, profile), Estimate: estimateOf(sp)})
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	if !record {
		fw.Discard()
	}
	defer func() {
		if err := fw.Close(context.WithoutCancel(ctx)); err != nil {
			s.log.Error("proxy: persisting the conversation's decisions", "err", err)
		}
	}()
	stripUsage := false
	var edits []wire.Edit
	if d.AskUsage && sp.Stream {
		// The engine measures from usage: ask for it, and keep the extra
		// chunk from a client that did not.
		var e *wire.Edit
		if e, stripUsage = includeUsage(sp); e != nil {
			edits = append(edits, *e)
		}
	}
	req := upstream.Request{Path: r.URL.Path, Query: s.forwardQuery(r), Header: s.forwardHeader(r), APIKey: s.upstreamKey(r, tenant)}
	// rules and shrunk are the last attempt's: what it did not send for a
	// provider rule, and how many it shrank.
	var rules []policy.Removal
	var shrunk int
	send := func() (*http.Response, error) {
		shrinker := s.engine.ShrinkerFor(tenant)
		out, removed, resized := policy.CheckProviderRules(ctx, fw.Messages, profile.Limits, shrinker)
		if err := engine.ShrinkRefusal(shrinker); err != nil {
			return nil, err
		}
		rules, shrunk = removed, len(resized)
		if req.Body, err = s.splice(ctx, tenant, d, sp, asIs, msgs, out, edits); err != nil {
			return nil, err
		}
		req.Body = req.Body.Tracked(&readers)
		return up.Client.Send(ctx, req)
	}
	pre := time.Since(start)
	resp, err := send()
	var we *wire.Error
	if errors.As(err, &we) && we.Kind == wire.PromptTooLong && fw.Overflow() {
		// Replay once, without the kept images and the user's older
		// ones: a body that differs. With nothing left to remove the
		// upstream's error is the answer at once.
		resp, err = send()
		outcome := "ok"
		if err != nil {
			outcome = "failed"
		}
		s.metrics.overflow.WithLabelValues(string(reason.Overflow), outcome).Inc()
	}
	s.countSent(fw, rules, shrunk)
	s.logRemovals(tenant, sp.Model, fw)
	if !record && countsTokens(r.URL.Path) && errors.As(err, &we) && (we.Status == http.StatusNotFound || we.Status == http.StatusMethodNotAllowed) && d.CountAnswer != nil {
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
		w.Header().Set("X-Imgctx-Token-Count", "estimated")
		replyJSON(w, http.StatusOK, d.CountAnswer(n))
		return
	}
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	defer resp.Body.Close()
	copyHeader(w.Header(), resp.Header)
	if sp.Stream && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		s.metrics.latency.Observe(pre.Seconds())
		u, cut := s.streamThrough(w, resp, d, stripUsage)
		fw.Observe(u, cut)
		return
	}
	// Not a stream (asked for or not): the answer as it came.
	b, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes+1))
	if err != nil {
		s.fail(w, sh, reason.Wrap(reason.Invalid, "upstream: reading the response", err))
		return
	}
	if int64(len(b)) > s.cfg.MaxResponseBytes {
		for k := range w.Header() {
			delete(w.Header(), k)
		}
		writeError(w, sh, http.StatusBadGateway, "api_error", fmt.Sprintf("the upstream's answer is over the limit of %d bytes (upstream.max_response_bytes)", s.cfg.MaxResponseBytes))
		return
	}
	post := time.Now()
	w.WriteHeader(resp.StatusCode)
	w.Write(b)
	if f, ok := w.(http.Flusher); ok {
		f.Flush() // the answer is the client's before the decisions are persisted
	}
	s.metrics.latency.Observe((pre + time.Since(post)).Seconds())
	if resp.StatusCode/100 == 2 {
		u, cut := d.Answer(b)
		s.metrics.usage(u)
		fw.Observe(u, cut)
	}
}

// countsTokens reports whether a path is a token-count endpoint.
func countsTokens(path string) bool {
	return strings.HasSuffix(path, "/count_tokens") || strings.HasSuffix(path, "/input_tokens") || strings.HasSuffix(path, ":countTokens")
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

// textOf counts what messages[from:] of a proxied request bill as text: each
// is decoded from its own bytes (the view carries no text), its text
// counted with the profile's tokenizer, plus each message's framing.
func textOf(d *dialect, sp *wire.Spliced, p tokens.Profile) func(int) int {
	decode := d.DecodeMessage
	counter := tokens.CounterFor(p.Tokenizer)
	return func(from int) int {
		n := 0
		for _, m := range sp.Marks[min(from, len(sp.Marks)):] {
			n += tokens.MessageFraming
			msgs, err := decode(sp.Body[m.Start:m.End])
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

// countSent counts a request's images once, as its last attempt sent
// them: every one not sent with its reason (removed now or before), those
// shrunk to a provider limit, those sent.
func (s *Server) countSent(fw *engine.Forwarded, rules []policy.Removal, shrunk int) {
	for _, r := range append(append([]policy.Removal(nil), fw.NotSent...), rules...) {
		s.metrics.images.WithLabelValues("not_sent", string(r.Reason)).Inc()
	}
	for range shrunk {
		s.metrics.images.WithLabelValues("shrunk", string(reason.ProviderLimit)).Inc()
	}
	sent := 0
	for _, m := range fw.Messages {
		sent += len(m.Images())
	}
	s.metrics.images.WithLabelValues("sent", "").Add(float64(sent - len(rules)))
}

// logRemovals writes one line for a request that removed images.
func (s *Server) logRemovals(tenant, model string, fw *engine.Forwarded) {
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
	s.log.Info("proxy: images removed", attrs...)
}

// slotsBefore is how many of sp's slots lie in its first n messages.
func slotsBefore(sp *wire.Spliced, n int) int {
	if n < len(sp.Marks) {
		return sp.Marks[n].Slots
	}
	return len(sp.Slots)
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

// includeUsage turns stream_options.include_usage on. It returns the edit
// (nil when the client asked already) and whether the client did not ask.
func includeUsage(sp *wire.Spliced) (*wire.Edit, bool) {
	opts, ok := sp.Top["stream_options"]
	if !ok {
		return &wire.Edit{Start: sp.End, End: sp.End, Write: func(w *wire.BodyWriter) {
			w.WriteString(`,"stream_options":{"include_usage":true}`)
		}}, true
	}
	o, err := wire.ParseObject(sp.Body[opts.Start:opts.End])
	if err != nil {
		return nil, false
	}
	if v, ok := o.Get("include_usage"); ok && string(bytes.TrimSpace(v)) == "true" {
		return nil, false
	}
	o.Set("include_usage", []byte("true"))
	b, _ := o.MarshalJSON()
	return &wire.Edit{Start: opts.Start, End: opts.End, Write: func(w *wire.BodyWriter) { w.Write(b) }}, true
}

// ingestSlots reads every image and document of the request — a re-sent
// one only recognised, a new one decoded and checked, in parallel (that
// work is CPU-bound and independent per image) — and, once every one is
// accepted, stores the new ones by ref: a refused request stores nothing.
// It returns the view with each slot filled in, and for each slot whether
// its bytes can go upstream as they came (inline standard base64).
//
// It also returns each slot's span key (nil where it has none), for the
// next request of the conversation.
func (s *Server) ingestSlots(ctx context.Context, tenant string, sp *wire.Spliced, keys []*spanKey) ([]chat.Message, []bool, []*spanKey, error) {
	read := make([]lifted, len(sp.Slots))
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
			read[i], errs[i] = s.readSlot(ctx, tenant, sp.Body, slot, key)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, nil, nil, err
	}
	msgs := chat.CloneMessages(sp.Messages)
	// Images first, origins after: whether a user message only carries a
	// tool's images depends on all of its parts.
	var toolEcho []int
	asIs := make([]bool, len(sp.Slots))
	found := make([]*spanKey, len(sp.Slots))
	for i, slot := range sp.Slots {
		in := read[i].in
		if err := s.commit(ctx, tenant, read[i]); err != nil {
			if slot.Pos.Nested < 0 || slot.Kind != "image" || !read[i].canonical {
				return nil, nil, nil, reason.Wrap(reason.Refused, "the image store refused an image", err)
			}
			// Seed keep-turn-images, "rangement refusé": a tool image the
			// store refuses goes on as it came, ephemeral (relaying it
			// finds it unstored and stops keeping for the turn).
			s.log.Warn("the image store refused a tool image: it is sent as it came, this turn only", "err", err)
		} else if slot.Via == "base64" && read[i].data == nil {
			s.metrics.images.WithLabelValues("deduplicated", "").Inc() // re-sent: recognised, not stored again
		}
		asIs[i], found[i] = read[i].canonical, read[i].key
		if slot.Kind == "document" {
			wire.Put(msgs, slot.Pos, chat.Document{Ref: in.Ref, MediaType: in.MediaType, Pages: in.Pages})
			continue
		}
		origin := chat.FromUser
		if slot.Pos.Nested >= 0 || msgs[slot.Pos.Msg].Role == chat.Tool {
			// Inside a tool result, or beside one in the tools' answer
			// (gemini-cli puts a screenshot next to its functionResponse).
			origin = chat.FromTool
		} else {
			toolEcho = append(toolEcho, i)
		}
		wire.Put(msgs, slot.Pos, chat.Image{Ref: in.Ref, MediaType: in.MediaType, Bytes: in.Bytes, Width: in.Width, Height: in.Height,
			Detail: slot.Detail, Origin: origin})
	}
	for _, i := range toolEcho {
		if at := sp.Slots[i].Pos; chat.RelaysTool(msgs, at.Msg) {
			img := wire.At(msgs, at).(chat.Image)
			img.Origin = chat.FromTool
			wire.Put(msgs, at, img)
		}
	}
	return msgs, asIs, found, nil
}

// readSlot reads one slot: inline base64, or a ref or URL the engine
// resolves (refs tenant-checked, URLs through the SSRF guard).
func (s *Server) readSlot(ctx context.Context, tenant string, body []byte, slot wire.Slot, key *spanKey) (lifted, error) {
	var l lifted
	var err error
	if slot.Via == "base64" {
		l, err = s.liftBase64(ctx, tenant, slot.Data.Of(body), slot.MediaType, key)
	} else {
		l.data, l.in, err = s.engine.Resolve(ctx, tenant, slot.URL)
	}
	if err != nil {
		return lifted{}, err
	}
	if slot.Kind == "image" && l.in.Kind != media.KindImage {
		return lifted{}, reason.New(reason.Invalid, l.in.MediaType+" sent as an image")
	}
	return l, nil
}

// splice writes the request for the upstream: each slot as the policies
// left it (unchanged inline data as it came; a ref expanded; a shrunk copy
// with its resize note; a marker as text), plus edits at the top level.
func (s *Server) splice(ctx context.Context, tenant string, d *dialect, sp *wire.Spliced, asIs []bool, in, out []chat.Message, edits []wire.Edit) (wire.Body, error) {
	edits = append([]wire.Edit(nil), edits...)
	src := s.engine.ImageSource(ctx, tenant)
	for i, slot := range sp.Slots {
		before, after := wire.At(in, slot.Pos), wire.At(out, slot.Pos)
		switch p := after.(type) {
		case chat.Image:
			was, _ := before.(chat.Image)
			if p.Ref == was.Ref && asIs[i] {
				continue // sent as it came
			}
			mt, b64, _, err := src(p)
			if err != nil {
				return wire.Body{}, err
			}
			edits = append(edits, sourceEdit(d, slot, mt, b64))
			if p.Ref != was.Ref && was.Width > 0 {
				note := policy.ResizeNote(was.Width, was.Height, p.Width, p.Height)
				edits = append(edits, wire.Edit{Start: slot.Part.End, End: slot.Part.End, Write: func(w *wire.BodyWriter) {
					w.WriteByte(',')
					d.WriteText(w, note, nil)
				}})
			}
		case chat.Document:
			if asIs[i] {
				continue
			}
			b64, err := s.engine.Base64(ctx, tenant, p.Ref)
			if err != nil {
				return wire.Body{}, err
			}
			edits = append(edits, sourceEdit(d, slot, p.MediaType, b64))
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

func sourceEdit(d *dialect, slot wire.Slot, mediaType, b64 string) wire.Edit {
	return wire.Edit{Start: slot.Source.Start, End: slot.Source.End, Write: func(w *wire.BodyWriter) { d.WriteSource(w, mediaType, b64) }}
}

// streamThrough forwards server-sent events as they come, one flush per
// event, and returns the usage they carry and whether the completion was
// cut. A client that goes away cancels the request context, which stops
// the upstream read. With stripUsage, the usage-only chunk imgctx asked
// for is kept from the client.
func (s *Server) streamThrough(w http.ResponseWriter, resp *http.Response, d *dialect, stripUsage bool) (*chat.Usage, bool) {
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(resp.StatusCode)
	flusher, _ := w.(http.Flusher)
	sr := wire.NewSSEReader(resp.Body)
	events := d.NewStream()
	for {
		ev, err := sr.Next()
		if err != nil {
			break
		}
		if events.Add(ev, stripUsage) {
			continue
		}
		if _, err := w.Write(ev.Raw); err != nil {
			return nil, false // the client went away: nothing to measure
		}
		if flusher != nil {
			flusher.Flush()
		}
	}
	u, cut, done := events.Result()
	if !done {
		return nil, false // cut off: no measurement
	}
	s.metrics.usage(u)
	return u, cut
}
