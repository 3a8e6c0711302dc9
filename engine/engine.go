// Package engine decides what of a conversation's images goes to the
// model. It serves two paths. Call runs the turn loop of a stateful
// session: it ingests the client's new messages (images stored once by
// ref, within limits), applies the policies (turn start, keep images at
// their measured cost, images-first eviction, the reactive net on
// prompt-too-long and cut completions, compaction with a slimmed side
// query, microcompaction when idle, provider rules), talks to the upstream
// in its own wire format, measures what came back, and persists
// everything so a restarted process resumes exactly. Proxy serves one
// drop-in request whole: the body read in place, its media ingested, the
// same turn model applied to the client's history, the body spliced and
// sent, the answer read. Every decision is an Event, handed to a sink.
package engine

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// Config tunes the engine. Zero fields take the defaults.
type Config struct {
	Keep    policy.KeepConfig
	Compact policy.CompactConfig
	Micro   policy.MicroConfig // zero: policy.DefaultMicro()
	// CompactThreshold is the share of the window past which, before a
	// request, kept images leave and then compaction runs; default 0.8.
	CompactThreshold float64
	// MaxTokens is the completion budget of Anthropic requests; default 4096.
	MaxTokens int
	Limits    media.Limits
	// Base64CacheBytes bounds the cache of encoded images; default 256 MB.
	Base64CacheBytes int64
	// Hints override the model profile for this upstream.
	Hints Hints
	// ShrinkPixelsPerRequest bounds the pixels one request's shrinking may
	// decode (default 200 M).
	ShrinkPixelsPerRequest int64
	// ShrinkMemory bounds what decoding and scaling images (to shrink
	// them, or for thumbnails) holds at once across requests, as
	// media.ShrinkMemory estimates each (default 512 MB). A tenant holding
	// some may hold half of it at most; a decode that waits longer than
	// ShrinkWait is refused with ErrBusy.
	ShrinkMemory int64
	ShrinkWait   time.Duration // default 10 s
	// KeepLowWater is the share of the keep budget (or of the provider's
	// image or byte limit) an eviction batch comes down to (default 0.1:
	// room for many more images before the next batch, each of which
	// breaks the provider's cached prefix once).
	KeepLowWater float64
	// CacheTTL is how long the provider keeps a prompt cache warm (default
	// 5 minutes): a proxied conversation idle longer evicts at once, since
	// the batch then breaks nothing.
	CacheTTL time.Duration
	// ProxyMaxImages caps the image decisions kept per proxied
	// conversation (default 10,000); past it they start over.
	ProxyMaxImages int
	// ProxyRelief is the share of the window past which the proxy relieves
	// window pressure (default 1, or CompactThreshold if higher): earlier,
	// it would only postpone the compaction of a client that compacts when
	// refused (claude-code 2.1.332).
	ProxyRelief float64
	// ProxyClientWindow: a proxied request whose history as the client
	// sent it — the images imgctx took out back in — is past the window,
	// where the conversation's text fills over half of it, is refused as
	// the provider would have refused it without imgctx (wire.Dialect
	// TooLong): a client that compacts when refused (claude-code 2.1.332)
	// compacts where it would have, and imgctx's removals never put its
	// cut off (proxy.client_window). Only at keep.sight's default or
	// below: above it the user pays to see more, and the cut put off is
	// how more stays in sight. At any sight, a request past the window is
	// not relieved where the client's compaction costs less
	// (proxyTurn.compactionPays).
	ProxyClientWindow bool
	// ProxyCached is how many proxied conversations are held in memory in
	// front of the session store (default 4,096, about 2 KB each).
	ProxyCached int
	// UpstreamFiles: the drop-in routes send images to Upstream by file id
	// (upstream.file_ids auto), as Route.Files does for a listed upstream.
	UpstreamFiles bool
	// FilesOffFor is how long a provider's quota error, or an upstream
	// with no Files API, turns file uploads off for that credential
	// (default 10 minutes).
	FilesOffFor time.Duration
	// Replay bounds the history images of flat upstreams (llama.cpp,
	// Ollama); nil: policy.DefaultReplay's caps. A zero cap is taken
	// literally: no history images, each still counted.
	Replay *policy.ReplayConfig
}

// Hints are what an upstream says of itself, over the model profile: a
// local server with a smaller window, a text-only deployment.
type Hints struct {
	Vision        *bool // nil: the profile's
	ContextWindow int   // 0: the profile's
}

// Profile is the model profile the engine uses for model: the table's,
// with the upstream's hints applied.
func (e *Engine) Profile(model string) tokens.Profile {
	return e.ProfileWith(model, e.Hints)
}

// ProfileWith is the model profile with another upstream's hints applied
// (the gateway routes to several upstreams).
func (e *Engine) ProfileWith(model string, h Hints) tokens.Profile {
	p := e.resolveProfile(model)
	if h.Vision != nil {
		p.Vision = *h.Vision
	}
	if h.ContextWindow > 0 {
		p.ContextWindow = h.ContextWindow
	}
	return p
}

// ErrBusy: decoding images would hold more memory than the engine may, and
// did not get it in time; the request may be retried shortly.
var ErrBusy = errors.New("the gateway is decoding as many images as its memory allows (media.shrink_memory); retry shortly")

// memorySlots is a weighted semaphore of the bytes decodes hold, fair
// between tenants: one that holds some may hold half of it at most, so
// another tenant's decode always finds room once those before it end.
type memorySlots struct {
	mu       sync.Mutex
	cond     *sync.Cond
	size     int64
	used     int64
	byTenant map[string]int64
	wait     time.Duration
}

// Acquire waits until n bytes (at most size) are free for tenant; ErrBusy
// once it waited the slots' wait, ctx's error when ctx ends first.
func (m *memorySlots) Acquire(ctx context.Context, tenant string, n int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cond == nil {
		m.cond = sync.NewCond(&m.mu)
	}
	timer, cancel := context.WithTimeout(ctx, m.wait)
	defer cancel()
	stop := context.AfterFunc(timer, func() { m.mu.Lock(); m.cond.Broadcast(); m.mu.Unlock() })
	defer stop()
	for m.used+n > m.size || (m.byTenant[tenant] > 0 && m.byTenant[tenant]+n > m.size/2) {
		if err := ctx.Err(); err != nil {
			return err
		}
		if timer.Err() != nil {
			return ErrBusy
		}
		m.cond.Wait()
	}
	m.used += n
	m.byTenant[tenant] += n
	return nil
}

// Release frees tenant's n bytes.
func (m *memorySlots) Release(tenant string, n int64) {
	m.mu.Lock()
	m.used -= n
	if m.byTenant[tenant] -= n; m.byTenant[tenant] <= 0 {
		delete(m.byTenant, tenant)
	}
	if m.cond != nil {
		m.cond.Broadcast()
	}
	m.mu.Unlock()
}

// resolveProfile is Profiles.Resolve behind a small cache: every proxied
// request names its model, and an unknown one is warned about once while
// it stays cached, not on every request.
func (e *Engine) resolveProfile(model string) tokens.Profile {
	e.once.Do(e.init)
	e.profMu.Lock()
	p, ok := e.profiles[model]
	e.profMu.Unlock()
	if ok {
		return p
	}
	p = e.Profiles.Resolve(model, e.log())
	if len(model) <= 256 {
		e.profMu.Lock()
		if len(e.profiles) >= 1024 {
			clear(e.profiles) // bounded: client input names the models
		}
		e.profiles[model] = p
		e.profMu.Unlock()
	}
	return p
}

// Engine runs sessions. Build it with its fields set, then use it from many
// goroutines: calls on one session are serialised, others run in parallel.
type Engine struct {
	Config
	Images   imagestore.Store
	Sessions session.Store
	Profiles *tokens.Table
	Upstream *upstream.Client
	Fetcher  *media.Fetcher   // nil: image URLs are refused
	Shrinker *media.Shrinker  // nil: images over provider limits become markers
	Sink     func(Event)      // nil: events are only returned
	Log      *slog.Logger     // nil: slog.Default()
	Now      func() time.Time // nil: time.Now

	once        sync.Once
	decodeSlots *memorySlots
	thumbs      *thumbCache
	locks       sessionLocks
	b64         *base64Cache
	meta        *metaCache
	profMu      sync.Mutex
	profiles    map[string]tokens.Profile
	proxied     *proxiedCache
	files       providerFiles
	spans       *spanCache
	states      *stateCache
	// seeing holds the tenant and model pairs an image was measured for:
	// a new conversation (a client's compaction starts one) need not
	// measure its own before its screenshots may stay unmeasured.
	seeing  sync.Map
	invalid error // Config.Validate's, at first use
}

// Event is one decision the engine made, for logs, metrics and the caller.
type Event struct {
	Session session.ID
	Kind    string // "kept", "removed", "compacted", "retried", "measured", "stored", "trial"
	Ref     blob.Ref
	Reason  reason.Code
	Tokens  int
	Detail  string
	// Compaction is what a "compacted" event ran: CompactedSummary,
	// CompactedShared (a summary on the live prefix, sharing its cache) or
	// CompactedMicro; the metrics count by it, never by Detail's words.
	Compaction string
}

// The compactions an Event names.
const (
	CompactedSummary = "summary"
	CompactedShared  = "summary_shared"
	CompactedMicro   = "micro"
)

// Result is what one call returns.
type Result struct {
	Message chat.Message // the assistant's reply
	Usage   *chat.Usage
	Events  []Event
	TurnEnd bool // the reply called no tool: the turn is over
	// Record is the turn's line of the request log as the engine knows it:
	// the session, model, usage priced, the images of the live context as
	// last sent, first removals and replays.
	Record session.Request
}

// Errors callers branch on.
var (
	// ErrContextFull: the prompt is too long even without kept images and
	// after compaction.
	ErrContextFull = errors.New("context window full even after removing images and compacting")
	// ErrUnknownRef: an imgctx: ref the tenant's store does not hold.
	ErrUnknownRef = errors.New("unknown image ref")
	// ErrBadTurn: the messages do not fit the turn (tool results without an
	// open turn, say).
	ErrBadTurn = errors.New("messages do not fit the session's turn")
)

func (e *Engine) init() {
	e.invalid = e.Config.Validate()
	e.b64 = newBase64Cache(e.Base64CacheBytes)
	e.meta = &metaCache{max: 100_000, m: map[blob.Ref]media.Info{}}
	e.profiles = map[string]tokens.Profile{}
	e.spans = newSpanCache()
	e.states = newStateCache()
	cached := e.ProxyCached
	if cached <= 0 {
		cached = 4096
	}
	e.proxied = &proxiedCache{max: cached, m: map[string]*list.Element{}, order: list.New()}
	at := e.ShrinkMemory
	if at <= 0 {
		at = media.DefaultShrinkMemory
	}
	wait := e.ShrinkWait
	if wait <= 0 {
		wait = 10 * time.Second
	}
	e.decodeSlots = &memorySlots{size: at, wait: wait, byTenant: map[string]int64{}}
	e.thumbs = newThumbCache()
}

func (e *Engine) now() time.Time {
	if e.Now != nil {
		return e.Now()
	}
	return time.Now()
}

func (e *Engine) log() *slog.Logger {
	if e.Log != nil {
		return e.Log
	}
	return slog.Default()
}

func (e *Engine) threshold(window int) int {
	return int(e.compactShare() * float64(window))
}

func (c Config) compactShare() float64 {
	if c.CompactThreshold <= 0 {
		return 0.8
	}
	return c.CompactThreshold
}

func (e *Engine) micro() policy.MicroConfig {
	if !e.Micro.Off && e.Micro.IdleAfter == 0 && e.Micro.CompactableTools == nil {
		return policy.DefaultMicro()
	}
	return e.Micro
}

// lock serialises the calls of a session: in this process, and across
// processes when the store is shared (replicas), where the upstream call of
// a turn must not run twice from one state.
func (e *Engine) lock(ctx context.Context, tenant string, id session.ID) (func(), error) {
	unlock := e.locks.lock(tenant + "/" + string(id))
	shared, ok := e.Sessions.(session.Shared)
	if !ok {
		return unlock, nil
	}
	release, err := shared.Lock(ctx, tenant, id)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() { release(); unlock() }, nil
}

// sessionLocks serialises the calls of each session. An entry lives only
// while a call holds or awaits it, so the map does not grow with every
// session ever seen (a soak run caught the sync.Map that did).
type sessionLocks struct {
	mu sync.Mutex
	m  map[string]*sessionLock
}

type sessionLock struct {
	mu   sync.Mutex
	refs int // calls holding or awaiting mu
}

func (l *sessionLocks) lock(key string) (unlock func()) {
	l.mu.Lock()
	if l.m == nil {
		l.m = map[string]*sessionLock{}
	}
	s := l.m[key]
	if s == nil {
		s = &sessionLock{}
		l.m[key] = s
	}
	s.refs++
	l.mu.Unlock()
	s.mu.Lock()
	return func() {
		s.mu.Unlock()
		l.mu.Lock()
		if s.refs--; s.refs == 0 {
			delete(l.m, key)
		}
		l.mu.Unlock()
	}
}

// NewSession creates a session with its settings.
func (e *Engine) NewSession(ctx context.Context, tenant string, st chat.Settings, thread chat.Thread) (session.Meta, error) {
	if thread == "" {
		thread = chat.Main
	}
	return e.Sessions.Create(ctx, session.Meta{Tenant: tenant, Thread: thread, Settings: st})
}

// call is the working state of one Call.
type call struct {
	e       *Engine
	tenant  string
	meta    session.Meta
	st      session.State
	profile tokens.Profile
	turn    *policy.KeepTurn
	entries []session.Entry
	events  []Event
	// recallRounds counts the replies this call answered itself (recall).
	recallRounds int
	memo         *wire.Memo // the session's upstream encodings
	// files sends images by file id (upstream.file_ids); sent is what the
	// last main request sent, where files_from looks for a change (before,
	// the live context the turn started from, until a request is sent).
	files        *fileSender
	sent, before []chat.Message
}

func (c *call) emit(ev Event) {
	ev.Session = c.meta.ID
	c.events = append(c.events, ev)
	if c.e.Sink != nil {
		c.e.Sink(ev)
	}
}

func (c *call) removed(rs []policy.Removal) {
	for _, r := range rs {
		c.emit(Event{Kind: "removed", Ref: r.Ref, Reason: r.Reason, Tokens: r.Cost, Detail: r.Of})
	}
}

// Call runs one exchange of a session: incoming is the client's new
// messages — a user message to start a turn, or the results of the tools
// the last reply called. It returns the assistant's reply.
func (e *Engine) Call(ctx context.Context, tenant string, id session.ID, incoming []chat.Message) (*Result, error) {
	return e.CallOnce(ctx, tenant, id, "", incoming)
}

// ErrKeyReused: an idempotency key came again with other messages.
var ErrKeyReused = errors.New("this Idempotency-Key was used for other messages")

// MaxIdempotencyKey bounds an idempotency key.
const MaxIdempotencyKey = 255

// CallOnce is Call with an idempotency key (none: ""): a retry of the
// session's last turn with the same key and the same messages gets that
// turn's answer again — the model is not called, nothing is appended —
// with one event, "replayed"; the same key with other messages is
// ErrKeyReused. Only the last turn's key is kept, in the session's state,
// so a retry on another replica finds it too.
func (e *Engine) CallOnce(ctx context.Context, tenant string, id session.ID, key string, incoming []chat.Message) (*Result, error) {
	e.once.Do(e.init)
	if len(key) > MaxIdempotencyKey {
		return nil, reason.New(reason.Invalid, fmt.Sprintf("Idempotency-Key of %d bytes: the limit is %d", len(key), MaxIdempotencyKey))
	}
	if e.invalid != nil {
		return nil, e.invalid
	}
	unlock, err := e.lock(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	from, err := e.states.load(ctx, e.Sessions, tenant, id)
	if err != nil {
		return nil, err
	}
	meta, st := from.meta, from.st
	digest := ""
	if key != "" {
		b, err := json.Marshal(incoming)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(b)
		digest = hex.EncodeToString(sum[:])
		if a := st.Answered; a != nil && a.Key == key {
			if a.Digest != digest {
				return nil, ErrKeyReused
			}
			res := &Result{Message: a.Reply, Usage: a.Usage, TurnEnd: a.TurnEnd, Events: []Event{{Session: id, Kind: "replayed", Detail: "the answer to this Idempotency-Key's first request; the model was not called again"}}}
			res.Record = session.Request{Conversation: string(id), Model: meta.Settings.Model}
			return res, nil
		}
	}
	c := &call{e: e, tenant: tenant, meta: meta, st: st, memo: from.memo, before: st.Live[:len(st.Live):len(st.Live)]}
	c.st.Answered = nil
	c.profile = e.Profile(meta.Settings.Model)
	if len(incoming) == 0 {
		return nil, fmt.Errorf("%w: no messages", ErrBadTurn)
	}
	incoming, err = e.Ingest(ctx, tenant, incoming)
	if err != nil {
		return nil, err
	}
	if err := c.startOrContinue(incoming); err != nil {
		return nil, err
	}
	for _, m := range incoming {
		c.entries = append(c.entries, session.Entry{Message: &m})
	}
	res, err := c.exchange(ctx)
	if err != nil {
		return nil, err
	}
	// Persist the turn: entries and the state that goes with them, at once.
	c.st.LastActivity = e.now().UTC()
	if key != "" {
		c.st.Answered = &session.Answered{Key: key, Digest: digest, Reply: res.Message, Usage: res.Usage, TurnEnd: res.TurnEnd}
	}
	// Append encodes only what changed, and writes the live messages
	// from the first that did.
	c.st.Encoded, c.st.Unchanged = memo(from.held, c.st.Live)
	stored, err := e.Sessions.Append(ctx, tenant, id, c.entries, c.st)
	if err != nil {
		e.states.forget(tenant, id) // written or not: the store says at the next turn
		return nil, fmt.Errorf("persist session: %w", err)
	}
	if len(stored) > 0 {
		e.states.keep(meta, stored[len(stored)-1].Seq, c.st, c.memo)
	}
	res.Events = c.events
	res.Record = session.Request{Conversation: string(id), Model: meta.Settings.Model, Images: fatesOf(c.st.Live, c.profile),
		Window: c.profile.ContextWindow, Outline: foldedOf(c.st.Live)}
	priced(&res.Record, c.profile, res.Usage)
	res.Record.Removed, res.Record.Replays = countEvents(c.events)
	return res, nil
}

// foldedOf outlines a live context: each message's role and the bytes of
// its text (the sessions API's lines outline it whole: compaction rewrites
// it, and the window bounds it).
func foldedOf(msgs []chat.Message) []session.Folded {
	out := make([]session.Folded, len(msgs))
	for i, m := range msgs {
		out[i] = session.Folded{Role: string(m.Role), Bytes: len(m.TextContent())}
	}
	return out
}

func (c *call) keepTurn() policy.Turn {
	return policy.Turn{
		Config: c.e.Keep, Profile: c.profile, Thread: c.meta.Thread, Switch: c.meta.Settings.KeepTurnImages,
		State: c.st.Keep, Counter: tokens.CounterFor(c.profile.Tokenizer), Storer: storer{c.e.Images, c.tenant},
		Cut: c.e.threshold(c.profile.ContextWindow),
	}
}

// startOrContinue opens a turn for a user message, or resumes the open
// turn for tool results, relaying the images the tools returned.
func (c *call) startOrContinue(incoming []chat.Message) error {
	first := incoming[0].Role
	switch {
	case !c.st.TurnOpen && first == chat.User, !c.st.TurnOpen && first == chat.System:
		if idle := c.e.now().Sub(c.st.LastActivity); !c.st.LastActivity.IsZero() {
			if idle > c.e.cacheTTL() && idle <= time.Hour {
				c.st.Keep.Ledger.LongGaps++
			}
			live, stats := policy.Microcompact(c.st.Live, idle, len(c.st.Live), c.e.micro())
			if live2 := live; len(stats.Removed) > 0 || stats.Tool > 0 {
				c.st.Live = live2
				c.st.Keep.Base.Valid = false
				c.removed(stats.Removed)
				c.emit(Event{Kind: "compacted", Compaction: CompactedMicro, Detail: fmt.Sprintf("microcompaction after %s idle: %d tool results, %d media, %d nested media cleared", idle.Round(time.Second), stats.Tool, stats.Media, stats.NestedMedia)})
			}
		}
		c.turn = policy.StartTurn(c.keepTurn())
		var removed []policy.Removal
		c.st.Live, removed = c.turn.Start(c.st.Live)
		c.removed(removed)
		c.st.TurnStart = len(c.st.Live)
	case c.st.TurnOpen && first == chat.Tool:
		if c.st.Turn == nil {
			return fmt.Errorf("%w: the open turn has no saved state", ErrBadTurn)
		}
		named, err := answersOpenCalls(c.st.Live, incoming)
		if err != nil {
			return err
		}
		incoming = named
		c.turn = policy.ResumeTurn(c.keepTurn(), *c.st.Turn)
	case c.st.TurnOpen:
		return fmt.Errorf("%w: the last reply called tools; send their results (role tool) first", ErrBadTurn)
	default:
		return fmt.Errorf("%w: a turn starts with a user message", ErrBadTurn)
	}
	calls := lastCalls(c.st.Live)
	for _, m := range incoming {
		c.st.Live = append(c.st.Live, c.relay(policy.Caption(m, calls)))
	}
	return nil
}

// lastCalls looks up the tool calls of the last assistant message by id.
func lastCalls(live []chat.Message) func(string) (chat.ToolCall, bool) {
	byID := map[string]chat.ToolCall{}
	for i := len(live) - 1; i >= 0; i-- {
		if live[i].Role == chat.Assistant {
			for _, p := range live[i].Parts {
				if tc, ok := p.(chat.ToolCall); ok {
					byID[tc.ID] = tc
				}
			}
			break
		}
	}
	return func(id string) (chat.ToolCall, bool) { tc, ok := byID[id]; return tc, ok }
}

// answersOpenCalls checks that every tool result answers a call the last
// reply made — a result for another call would reach the upstream as a
// request it must refuse, or be taken as the answer to a call nobody made —
// and names each result after its call (neither wire carries the name on
// the result; microcompaction's tool list needs it).
func answersOpenCalls(live, incoming []chat.Message) ([]chat.Message, error) {
	open := map[string]string{}   // call id → tool name
	answered := map[string]bool{} // by imgctx itself (recall), after the reply
	for i := len(live) - 1; i >= 0; i-- {
		if live[i].Role == chat.Assistant {
			for _, p := range live[i].Parts {
				if tc, ok := p.(chat.ToolCall); ok {
					open[tc.ID] = tc.Name
				}
			}
			break
		}
		for _, p := range live[i].Parts {
			if tr, ok := p.(chat.ToolResult); ok {
				answered[tr.CallID] = true
			}
		}
	}
	out := make([]chat.Message, len(incoming))
	for i, m := range incoming {
		m = m.Clone()
		for j, p := range m.Parts {
			tr, ok := p.(chat.ToolResult)
			if !ok {
				continue
			}
			name, open := open[tr.CallID]
			if !open {
				return nil, fmt.Errorf("%w: a tool result for call %q, which the last reply did not make", ErrBadTurn, tr.CallID)
			}
			if answered[tr.CallID] {
				return nil, fmt.Errorf("%w: a tool result for call %q, which imgctx answered itself (%s): send the others only", ErrBadTurn, tr.CallID, name)
			}
			if tr.Name == "" {
				tr.Name = name
				m.Parts[j] = tr
			}
		}
		out[i] = m
	}
	return out, nil
}

// relay hands the images inside tool results to keeping.
func (c *call) relay(m chat.Message) chat.Message {
	if m.Role != chat.Tool {
		return m
	}
	m = m.Clone()
	for i, p := range m.Parts {
		tr, ok := p.(chat.ToolResult)
		if !ok {
			continue
		}
		for j, q := range tr.Parts {
			if img, ok := q.(chat.Image); ok {
				img = c.turn.Relay(img)
				tr.Parts[j] = img
				if img.Keep == chat.Trial {
					c.emit(Event{Kind: "stored", Ref: img.Ref, Detail: "trial"})
				}
			}
		}
		m.Parts[i] = tr
	}
	return m
}

// storer is policy.Storer over the image store: the image was stored at
// ingestion; keeping it refreshes its date and re-reads it byte-exact
// (the Verified store checks the hash).
type storer struct {
	s      imagestore.Store
	tenant string
}

func (s storer) StoreImage(ref blob.Ref) error {
	ctx := context.Background()
	if _, err := s.s.Get(ctx, s.tenant, ref); err != nil {
		return err
	}
	return s.s.Touch(ctx, s.tenant, ref)
}
