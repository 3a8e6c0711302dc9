package engine

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/maphash"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/wire"
)

// spanCache is what the engine remembers of the proxied requests it read:
// each inline base64 span by a hash of its text (agents re-send the same
// image on every request, and hashing its text is cheaper than decoding,
// hashing and storing it again), and each conversation's last scan.
type spanCache struct {
	seed    maphash.Seed
	mu      sync.Mutex
	spans   map[spanKey]seenSpan
	resumes map[resumeKey]resumed
	held    int    // bytes the resumes hold
	kept    uint64 // resumes kept so far
	// idleFor: a resume not replaced for this long is forgotten (0:
	// resumeIdleFor); trimming: a trim is timed for the oldest.
	idleFor  time.Duration
	trimming bool
}

func newSpanCache() *spanCache {
	return &spanCache{seed: maphash.MakeSeed(), spans: map[spanKey]seenSpan{}, resumes: map[resumeKey]resumed{}}
}

// checked is an image or document read from a request, checked, and not
// stored yet: a request's media are stored only once all are accepted.
type checked struct {
	in        media.Info
	canonical bool   // the text is the standard encoding: it can go upstream as it came
	data      []byte // the decoded bytes to store; nil when stored already
	key       *spanKey
}

// liftBase64 reads one inline base64 image or document: recognised by its
// span key when seen before, else decoded straight from the body — no copy
// of megabytes of text — and checked. Other forms than the standard
// encoding (URL-safe, unpadded, wrapped) are not canonical and go upstream
// re-encoded.
//
// b64 is a JSON string's contents as they stand in the body: JSON escapes
// ("\/") are undone only if decoding needs it. key, when not nil, is its
// span key computed already.
func (e *Engine) liftBase64(ctx context.Context, tenant string, b64 []byte, declared string, key *spanKey) (checked, error) {
	e.once.Do(e.init)
	if key == nil {
		k := e.spans.keyOf(tenant, b64)
		key = &k
	}
	if seen, ok := e.seenSpan(ctx, *key); ok {
		return checked{in: seen.info, canonical: seen.canonical, key: key}, nil
	}
	text := b64
	data, canonical, err := media.DecodeBase64Bytes(text)
	if err != nil && bytes.IndexByte(b64, '\\') >= 0 {
		var unescaped string
		if json.Unmarshal(append(append([]byte{'"'}, b64...), '"'), &unescaped) == nil {
			text = []byte(unescaped)
			data, canonical, err = media.DecodeBase64Bytes(text)
		}
	}
	if err != nil {
		return checked{}, err
	}
	in, err := e.Check(data, declared)
	if err != nil {
		return checked{}, err
	}
	return checked{in: in, canonical: canonical, data: data, key: key}, nil
}

// commit stores what a request checked, once all of it was accepted, and
// remembers the spans for the next request. It reports whether it stored
// anything.
func (e *Engine) commit(ctx context.Context, tenant string, l checked) (bool, error) {
	if l.data == nil {
		return false, nil
	}
	if err := e.Put(ctx, tenant, l.in, l.data); err != nil {
		return false, err
	}
	if l.key == nil {
		return true, nil // a URL's image: no span to remember
	}
	e.spans.remember(*l.key, seenSpan{ref: l.in.Ref, canonical: l.canonical, info: l.in, touched: time.Now()})
	return true, nil
}

// seenSpan is what a base64 text seen before turned out to be, and when
// its blob was last touched in the store.
type seenSpan struct {
	ref       blob.Ref
	canonical bool
	info      media.Info
	touched   time.Time
}

// TouchEvery is how often a re-sent image refreshes its blob's date (and
// so checks the blob is still there): an agent re-sends each screenshot on
// every request, and the store's GC counts in days.
const TouchEvery = time.Minute

// spanKey names a base64 span cheaply. The key holds the tenant and the
// length; a hit is only used after Touch finds the blob in that tenant's
// store, so a collision can never reach another tenant's image.
type spanKey struct {
	tenant string
	n      int
	h      uint64
}

func (c *spanCache) keyOf(tenant string, b64 []byte) spanKey {
	return spanKey{tenant, len(b64), maphash.Bytes(c.seed, b64)}
}

func (e *Engine) seenSpan(ctx context.Context, key spanKey) (seenSpan, bool) {
	c := e.spans
	c.mu.Lock()
	seen, ok := c.spans[key]
	c.mu.Unlock()
	if !ok {
		return seenSpan{}, false
	}
	if time.Since(seen.touched) < TouchEvery {
		return seen, true
	}
	if e.Images.Touch(ctx, key.tenant, seen.ref) != nil {
		return seenSpan{}, false // gone from the store: store it anew
	}
	seen.touched = time.Now()
	c.mu.Lock()
	c.spans[key] = seen
	c.mu.Unlock()
	return seen, true
}

func (c *spanCache) remember(key spanKey, seen seenSpan) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.spans) >= 50_000 {
		clear(c.spans) // bounded: start over rather than grow
	}
	c.spans[key] = seen
}

// hashAhead names each inline base64 span by its hash while the scan goes
// on (a re-sent image is then recognised at once): it returns the hook for
// the scan and a wait that gives the keys of the slots the scan kept, in
// their order (nil where a slot is not inline). A scanner may drop a slot
// it reported (a block type found to be the provider's), so keys are
// matched to slots by where their data starts. Nothing is decoded or
// stored before the scan succeeds.
func (c *spanCache) hashAhead(tenant string, body []byte) (func(wire.Slot), func([]wire.Slot) []*spanKey) {
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
			*k = c.keyOf(tenant, data)
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

// resumed is what the engine keeps of a conversation's last request: its
// scan (wire.Resume) and the span key of each of its slots, so the next
// request — the same history with a few messages more — is read from where
// they part and its re-sent images are not hashed again.
type resumed struct {
	res  *wire.Resume
	held *heldBody // the request memory res.Body is in
	kept uint64    // when it was kept, in keepResume calls: the oldest goes first
	at   time.Time // and the time then
	keys []*spanKey
	// filled is the request's view with its slots filled in, and room
	// behind it for the next request that extends it (ingestSlots).
	filled []chat.Message
	// applied: the same with the request's decisions put back, once they
	// are, for the next request that extends it (proxyRequest.Prior).
	applied *atomic.Pointer[[]chat.Message]
	// The conversation key, the identity it was made with and the opening
	// messages its fingerprint read: a request that takes those over byte
	// for byte has the same key, without decoding them again.
	convKey, convID string
	opening         int
	// sent: how the request went upstream (set once it is spliced), so
	// the next may be sent the same way as it arrives (upstream.Early).
	sent *atomic.Pointer[sentAs]
}

// appliedTo is the request's messages with its decisions put back, for a
// request that took its first from messages over in place, or nil.
func (r resumed) appliedTo(from int) []chat.Message {
	if from == 0 || r.applied == nil {
		return nil
	}
	if a := r.applied.Load(); a != nil && len(*a) == from {
		return *a
	}
	return nil
}

// resumeKey names a conversation cheaply: the tenant, the wire, the
// agent's own conversation headers when it sends them, and the first
// kilobytes of the body (model, system prompt, first messages). Two
// conversations that share a key only evict each other's entry: a resumed
// scan checks every byte it takes over.
type resumeKey struct {
	tenant string
	h      uint64
}

// conversationHeaders are the headers agents name their conversations by:
// imgctx's own, claude-code's, codex's, opencode's (and its forks').
var conversationHeaders = []string{"X-Imgctx-Session", "X-Claude-Code-Session-Id", "Session-Id", "X-Session-Id"}

func (c *spanCache) resumeKeyOf(tenant, wireName string, h http.Header, body []byte) resumeKey {
	var mh maphash.Hash
	mh.SetSeed(c.seed)
	mh.WriteString(wireName)
	for _, k := range conversationHeaders {
		mh.WriteString(h.Get(k))
		mh.WriteByte(0)
	}
	mh.Write(body[:min(len(body), 4096)])
	return resumeKey{tenant, mh.Sum64()}
}

// maxResumes and maxResumeBytes bound the conversations remembered and
// the request bytes they hold (each its last request's, up to the end of
// its messages, to compare the next one with); past either the
// conversations least recently sent are forgotten, and the next request
// of each is read whole.
const (
	maxResumes     = 256
	maxResumeBytes = 128 << 20
)

// resumeIdleFor is how long a conversation's last request is held with no
// next one. Past the provider's default cache lifetime (five minutes) the
// next request is a cold start, whose upstream reads the whole prompt
// again; reading the body whole too then costs a millisecond or two,
// against megabytes held for as long as the conversation is quiet — and a
// gateway whose traffic stops would otherwise hold its bound for good.
const resumeIdleFor = 5 * time.Minute

// resumeFor returns the conversation's resume, its body held until done
// is called.
func (c *spanCache) resumeFor(k resumeKey) (r resumed, done func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r = c.resumes[k]
	if r.held == nil {
		return r, func() {}
	}
	r.held.users++
	return r, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		r.held.users--
		r.held.free()
	}
}

// heldBody is the memory of a request a resume compares the next one
// with: the gateway's pooled buffer, handed back (release) once the resume
// is replaced or forgotten and no scan reads it any more.
type heldBody struct {
	users   int // scans reading it; under the cache's lock
	dropped bool
	release func()
	take    func() bool // Handover.Take, when the memory may be taken over
}

func (h *heldBody) free() {
	if h.dropped && h.users == 0 && h.release != nil {
		h.release()
		h.release = nil
	}
}

// take forgets the resume r of conversation k and hands its memory over,
// when r is still the conversation's, the one scan reading it is the
// caller's, and nothing else reads it (heldBody.take).
func (c *spanCache) take(k resumeKey, r resumed) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := r.held
	if cur, ok := c.resumes[k]; !ok || cur.held != h || h == nil || h.take == nil || h.users != 1 || h.dropped || !h.take() {
		return false
	}
	delete(c.resumes, k)
	c.held -= r.res.Bytes()
	h.dropped, h.release = true, nil
	return true
}

// forgetResumes lets go of every conversation's held request.
func (c *spanCache) forgetResumes() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range c.resumes {
		c.drop(r)
	}
	clear(c.resumes)
}

// dropOldest forgets the resume kept longest ago. A scan of the few
// hundred held is cheaper than keeping them in order on every request.
func (c *spanCache) dropOldest() {
	var oldest resumeKey
	at := ^uint64(0)
	for k, r := range c.resumes {
		if r.kept < at {
			oldest, at = k, r.kept
		}
	}
	c.drop(c.resumes[oldest])
	delete(c.resumes, oldest)
}

// drop forgets a resume the cache held.
func (c *spanCache) drop(r resumed) {
	r.held.drop()
	c.held -= r.res.Bytes()
}

// drop says no resume holds the body any more (nil: nothing to let go).
func (h *heldBody) drop() {
	if h != nil {
		h.dropped = true
		h.free()
	}
}

func (c *spanCache) keepResume(k resumeKey, r resumed) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.resumes[k]; ok {
		c.drop(old)
		delete(c.resumes, k)
	}
	if r.res.Bytes() > maxResumeBytes/2 {
		r.held.drop() // a request this large is read whole each time
		return
	}
	for len(c.resumes) > 0 && (len(c.resumes) >= maxResumes || c.held+r.res.Bytes() > maxResumeBytes) {
		c.dropOldest()
	}
	c.kept++
	r.kept, r.at = c.kept, time.Now()
	c.resumes[k] = r
	c.held += r.res.Bytes()
	if !c.trimming {
		c.trimming = true
		time.AfterFunc(c.idleTime(), c.trimIdle)
	}
}

func (c *spanCache) idleTime() time.Duration {
	if c.idleFor > 0 {
		return c.idleFor
	}
	return resumeIdleFor
}

// trimIdle forgets the resumes kept idleTime ago or more, and comes again
// when the oldest left will have been.
func (c *spanCache) trimIdle() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var next time.Time
	for k, r := range c.resumes {
		switch {
		case now.Sub(r.at) >= c.idleTime():
			c.drop(r)
			delete(c.resumes, k)
		case next.IsZero() || r.at.Before(next):
			next = r.at
		}
	}
	c.trimming = !next.IsZero()
	if c.trimming {
		time.AfterFunc(next.Add(c.idleTime()).Sub(now), c.trimIdle)
	}
}

// sentAs is how a request went upstream: the changes made to its client's
// body (none: as it came), and that body's length.
type sentAs struct {
	changes []wire.Change
	n       int
}

// maxChanged bounds the bytes a request's changes write (markers, notes,
// a field asked for) that are kept to make them again: images sent from
// the store (by ref, shrunk) are not kept for it.
const maxChanged = 64 << 10

// sentAsOf is how body went upstream from the client's buf; nil when it
// is not the client's bytes with small changes (a translation, an image
// from the store).
func sentAsOf(body wire.Body, buf []byte) *sentAs {
	changes, ok := body.Changes(buf, maxChanged)
	if !ok || wire.Written(changes) > maxChanged {
		return nil
	}
	return &sentAs{changes: changes, n: len(buf)}
}
