package engine

import (
	"container/list"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
)

// MaxResponseBytes bounds a non-streamed upstream response.
const MaxResponseBytes = 64 << 20

type response struct {
	message    chat.Message
	usage      *chat.Usage
	cut        bool
	windowFull bool
}

// send checks the provider rules, encodes the live context in the
// upstream's format, records it for measurement, and sends it.
func (c *call) send(ctx context.Context) (*response, error) {
	live, removed, shrunk, err := c.e.meetRules(ctx, c.tenant, c.st.Live, c.profile.Limits)
	if err != nil {
		return nil, err
	}
	if len(removed) > 0 || len(shrunk) > 0 {
		c.st.Live = policy.NoteResized(live, shrunk)
		c.removed(removed)
		for _, s := range shrunk {
			c.emit(Event{Kind: "shrunk", Ref: s.To.Ref, Reason: "provider_limit", Detail: s.Rule})
		}
		c.turn.InvalidateBase()
	}
	c.advanceFiles(c.st.Live)
	body, err := c.encode(ctx, c.st.Live, true)
	if err != nil {
		return nil, err
	}
	c.turn.Sending(c.st.Live)
	r, err := c.roundTrip(ctx, body)
	if c.files.missing(ctx, err) {
		// A file the provider no longer has: uploaded again, sent again.
		if body, err = c.encode(ctx, c.st.Live, true); err != nil {
			return nil, err
		}
		r, err = c.roundTrip(ctx, body)
	}
	return r, err
}

func (c *call) roundTrip(ctx context.Context, body wire.Body) (*response, error) {
	resp, err := c.e.Upstream.DoBody(ctx, body, c.files.header(nil))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, MaxResponseBytes))
	if err != nil {
		return nil, fmt.Errorf("read upstream response: %w", err)
	}
	a, err := c.e.sessionWire().DecodeAnswer(b)
	if err != nil {
		return nil, err
	}
	return &response{message: a.Message, usage: a.Usage, cut: a.Cut, windowFull: a.WindowFull}, nil
}

// SpeaksSessions reports whether the sessions API can call an upstream of
// that format (its Dialect encodes a whole session request); the drop-in
// routes serve every format.
func SpeaksSessions(f upstream.Format) bool {
	d, ok := upstream.Wires[f]
	return ok && d.EncodeSession != nil
}

// sessionWire is the upstream's wire for the sessions path (OpenAI's for
// one that cannot take it: the sessions API refuses such a turn first).
func (e *Engine) sessionWire() *wire.Dialect {
	if d := e.Upstream.Wire(); d.EncodeSession != nil {
		return d
	}
	return openai.Dialect
}

// encode writes msgs as a request in the upstream's format. With
// breakpoints (a wire that takes them: Anthropic), the system prompt, the
// last message before this turn holding a kept image and the newest
// message are marked for the prompt cache, so system, tools and kept
// images sit in the cached prefix. An image kept during the turn moves no
// breakpoint until the next turn: within a turn the requests are the same
// with the switch on or off.
func (c *call) encode(ctx context.Context, msgs []chat.Message, breakpoints bool) (wire.Body, error) {
	maxTokens := c.e.MaxTokens
	if maxTokens <= 0 {
		maxTokens = 4096
	}
	if breakpoints && c.meta.Settings.Recall {
		// The main request and the summary sharing its cache: the same
		// markers, the same tools (the tools head the cached prefix).
		msgs = withHandles(msgs, c.conversation(), nil)
	}
	r := wire.SessionRequest{Model: c.meta.Settings.Model, MaxTokens: maxTokens, Messages: msgs, Source: c.fileSource(ctx, msgs, c.e.ImageSource(ctx, c.tenant)), Memo: c.memo}
	if breakpoints && c.offersRecall() {
		r.Tools = []wire.Tool{recallTool}
	}
	if breakpoints {
		r.CacheSystem = len(msgs) > 0 && msgs[0].Role == chat.System
		if c.hourCache() {
			// The ends of the two turns before this one keep for an hour:
			// the next turn, coming after the default lifetime, reads the
			// conversation back to the last one; the one before it is
			// where this turn's first request found it.
			r.CacheHour = true
			end := min(len(msgs), c.st.TurnStart)
			for range 2 {
				if end <= 0 || (end == 1 && r.CacheSystem) {
					break
				}
				r.CacheMessages = append([]int{end - 1}, r.CacheMessages...)
				end = turnBefore(msgs, end-1)
			}
		} else {
			for i := min(len(msgs), c.st.TurnStart) - 1; i >= 0; i-- {
				if holdsKept(msgs[i]) {
					r.CacheMessages = append(r.CacheMessages, i)
					break
				}
			}
		}
		if n := len(msgs) - 1; n >= 0 && (len(r.CacheMessages) == 0 || r.CacheMessages[len(r.CacheMessages)-1] != n) {
			r.CacheMessages = append(r.CacheMessages, n)
		}
	}
	return c.e.sessionWire().EncodeSession(r)
}

// turnBefore is where the turn holding message i starts: its human
// message (a user message), or 0.
func turnBefore(msgs []chat.Message, i int) int {
	for ; i > 0; i-- {
		if msgs[i].Role == chat.User {
			return i
		}
	}
	return 0
}

func holdsKept(m chat.Message) bool {
	kept := false
	chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
		if img, ok := p.(chat.Image); ok && img.Keep == chat.Kept {
			kept = true
		}
		return !kept
	})
	return kept
}

// summariser is compaction's side query to the same upstream. It only ever
// receives Slim's output, and the provider rules are checked on it too.
type summariser struct{ c *call }

// SummaryPrompt is the summariser's instruction.
const SummaryPrompt = "You summarise conversations between a user and an assistant that uses tools. " +
	"Keep every fact, decision, file name, number and open task; say what each image or document showed when the text tells. Be concise. " +
	"After the summary, write one line per image of the conversation, in order, as \"Image 1: <what it showed>\", \"Image 2: …\"."

func (s summariser) Summarise(ctx context.Context, msgs []chat.Message) (string, error) {
	req := append([]chat.Message{{Role: chat.System, Parts: []chat.Part{chat.Text{Text: SummaryPrompt}}}}, msgs...)
	req = append(req, chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "Summarise the conversation above."}}})
	req, _, _ = policy.CheckProviderRules(ctx, req, s.c.profile.Limits, nil)
	body, err := s.c.encode(ctx, req, false)
	if err != nil {
		return "", err
	}
	return s.ask(ctx, body)
}

// SharedInstruction opens the instruction appended to the live context
// when the summary shares the provider's cache.
const SharedInstruction = "[imgctx: summary request]"

// SummariseShared asks the main model for the summary on the live context
// as the last request sent it — its prefix is in the provider's cache,
// images included, read at the cache's price — plus one instruction that
// names where the summary ends. It applies while the cache is warm: the
// last request within the cache TTL.
func (s sharingSummariser) SummariseShared(ctx context.Context, msgs []chat.Message, start, split int) (string, bool, error) {
	c := s.c
	if !c.cacheWarm() {
		return "", false, nil
	}
	ask := fmt.Sprintf("%s Summarise the conversation above from its start up to and including message %d of %d, which begins: %q. %s "+
		"The messages after it stay as they are. Answer with the summary only.", SharedInstruction, split-start, len(msgs)-start, opening(msgs[split-1]), SummaryPrompt)
	req := chat.CloneMessages(msgs)
	if last := &req[len(req)-1]; last.Role == chat.User {
		last.Parts = append(last.Parts, chat.Text{Text: ask}) // the roles keep alternating
	} else {
		req = append(req, chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: ask}}})
	}
	body, err := c.encode(ctx, req, true)
	if err != nil {
		return "", true, err
	}
	text, err := s.ask(ctx, body)
	return text, true, err
}

// sharingSummariser is a summariser that may share the provider's cache
// (policy.SharedSummariser).
type sharingSummariser struct{ summariser }

// opening is the start of a message's text, to name it to the model.
func opening(m chat.Message) string {
	t := []rune(m.TextContent())
	if len(t) > 80 {
		t = t[:80]
	}
	return string(t)
}

// ask sends a summary request and returns its text.
func (s summariser) ask(ctx context.Context, body wire.Body) (string, error) {
	r, err := s.c.roundTrip(ctx, body)
	var we *wire.Error
	if errors.As(err, &we) && we.Kind == wire.PromptTooLong {
		// The summariser's own overflow is not the main request's: the
		// client must not read it as an answer to what it sent.
		return "", fmt.Errorf("%w: the summary request itself is too long for the model (%s)", ErrContextFull, we.Message)
	}
	if err != nil {
		return "", fmt.Errorf("the summary request: %w", err)
	}
	var b strings.Builder
	for _, p := range r.message.Parts {
		if t, ok := p.(chat.Text); ok {
			b.WriteString(t.Text)
		}
	}
	if b.Len() == 0 {
		return "", fmt.Errorf("the summariser returned no text")
	}
	return b.String(), nil
}

// meetRules makes a request meet the provider's rules
// (policy.CheckProviderRules): what breaks one is shrunk when the engine
// has a media.Shrinker, else removed. Decoding is bounded: per request by
// ShrinkPixelsPerRequest (past it the request is refused too_large), and
// across requests by the memory decodes hold (ShrinkMemory: ErrBusy past
// the wait).
func (e *Engine) meetRules(ctx context.Context, tenant string, msgs []chat.Message, lim tokens.Limits) ([]chat.Message, []policy.Removal, []policy.Shrunk, error) {
	e.once.Do(e.init)
	var sh *shrinker
	var ps policy.Shrinker // nil unless there is a shrinker: a typed nil is not nil
	if e.Shrinker != nil {
		sh = &shrinker{e: e, tenant: tenant, left: e.shrinkPerRequest()}
		ps = sh
	}
	out, removed, resized := policy.CheckProviderRules(ctx, msgs, lim, ps)
	if sh != nil && sh.refused != nil {
		return nil, nil, nil, sh.refused
	}
	return out, removed, resized, nil
}

func (e *Engine) shrinkPerRequest() int64 {
	if e.ShrinkPixelsPerRequest > 0 {
		return e.ShrinkPixelsPerRequest
	}
	return 200_000_000
}

// shrinker makes an image meet a provider limit: shrink, store, refer.
type shrinker struct {
	e       *Engine
	tenant  string
	left    int64 // pixels this request may still decode
	refused error
}

// Plan refuses, before anything is decoded, a request whose shrinking
// would decode more than its budget; images shrunk before (cached) cost
// nothing.
func (s *shrinker) Plan(_ context.Context, plans []policy.Plan) {
	var px int64
	for _, p := range plans {
		if _, ok := s.e.Shrinker.Cached(p.Image.Ref, media.Target{MaxEdge: p.MaxEdge, MaxBytes: p.MaxBytes}); !ok {
			px += max(int64(p.Image.Width)*int64(p.Image.Height), 1)
		}
	}
	if px > s.left {
		s.refused = reason.New(reason.TooLarge, fmt.Sprintf("shrinking this request's images would decode %d pixels, more than %d (media.shrink_max_pixels_per_request)", px, s.e.shrinkPerRequest()))
	}
}

func (s *shrinker) Shrink(ctx context.Context, img chat.Image, maxEdge int, maxBytes int64) (chat.Image, error) {
	t := media.Target{MaxEdge: maxEdge, MaxBytes: maxBytes}
	out, ok := s.e.Shrinker.Cached(img.Ref, t)
	if !ok {
		// A decode costs its pixels: a request of many huge images is
		// refused rather than decoded for a minute, and all requests
		// together decode a bounded number of pixels at a time.
		px := max(int64(img.Width)*int64(img.Height), 1)
		if s.refused != nil || px > s.left {
			if s.refused == nil {
				s.refused = reason.New(reason.TooLarge, fmt.Sprintf("shrinking this request's images would decode more than %d pixels (media.shrink_max_pixels_per_request)", s.e.shrinkPerRequest()))
			}
			return chat.Image{}, s.refused
		}
		s.left -= px
		weight := min(media.ShrinkMemory(img.Width, img.Height, t), s.e.decodeSlots.size)
		if err := s.e.decodeSlots.Acquire(ctx, s.tenant, weight); err != nil {
			// No memory in time (ErrBusy) or the request ended: the
			// request fails, the image is not removed for it.
			s.refused = err
			return chat.Image{}, err
		}
		data, err := s.e.Images.Get(ctx, s.tenant, img.Ref)
		if err == nil {
			out, err = s.e.Shrinker.Shrink(data, t)
		}
		s.e.decodeSlots.Release(s.tenant, weight)
		if err != nil {
			return chat.Image{}, err
		}
	}
	ref := blob.Of(out.Data)
	if err := s.e.Images.Put(ctx, s.tenant, ref, out.Data); err != nil {
		return chat.Image{}, err
	}
	img.Ref, img.MediaType, img.Bytes, img.Width, img.Height = ref, out.MediaType, int64(len(out.Data)), out.Width, out.Height
	img.Cost = 0
	return img, nil
}

// Base64 returns a stored image's bytes in base64, from a bounded cache so
// a hot ref expands at memory speed.
func (e *Engine) Base64(ctx context.Context, tenant string, ref blob.Ref) (string, error) {
	e.once.Do(e.init)
	if s, ok := e.b64.get(ref); ok {
		return s, nil
	}
	data, err := e.Images.Get(ctx, tenant, ref)
	if err != nil {
		return "", fmt.Errorf("expand %s: %w", ref, err)
	}
	s := base64.StdEncoding.EncodeToString(data)
	e.b64.put(ref, s)
	return s, nil
}

// ImageSource says how each image goes upstream for a tenant: a stored one
// as its (cached) standard base64 with its media type, any other by its
// URL. It serves as both openai.ImageURL and anthropic.Source.
func (e *Engine) ImageSource(ctx context.Context, tenant string) func(chat.Image) (mediaType, base64Data, url string, err error) {
	return func(img chat.Image) (string, string, string, error) {
		if !img.Ref.Valid() {
			// Not stored (the store refused a tool image): inline as it came.
			if _, b64, ok := strings.Cut(img.URL, ";base64,"); ok && strings.HasPrefix(strings.ToLower(img.URL), "data:") {
				return img.MediaType, b64, "", nil
			}
			return "", "", img.URL, nil
		}
		data, err := e.Base64(ctx, tenant, img.Ref)
		return img.MediaType, data, "", err
	}
}

// base64Cache is an LRU of encodings bounded by their total size. Refs are
// content addresses, so an entry never goes stale; callers only reach refs
// their tenant was allowed at ingestion.
type base64Cache struct {
	mu    sync.Mutex
	max   int64
	size  int64
	order *list.List // front: most recent; values are *b64Entry
	m     map[blob.Ref]*list.Element
}

type b64Entry struct {
	ref blob.Ref
	s   string
}

func newBase64Cache(max int64) *base64Cache {
	if max <= 0 {
		max = 256 << 20
	}
	return &base64Cache{max: max, order: list.New(), m: map[blob.Ref]*list.Element{}}
}

func (c *base64Cache) get(ref blob.Ref) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[ref]; ok {
		c.order.MoveToFront(el)
		return el.Value.(*b64Entry).s, true
	}
	return "", false
}

func (c *base64Cache) put(ref blob.Ref, s string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[ref]; ok || int64(len(s)) > c.max {
		return
	}
	c.m[ref] = c.order.PushFront(&b64Entry{ref, s})
	c.size += int64(len(s))
	for c.size > c.max {
		el := c.order.Back()
		en := c.order.Remove(el).(*b64Entry)
		delete(c.m, en.ref)
		c.size -= int64(len(en.s))
	}
}
