package engine

import (
	"container/list"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/wire"
)

// MaxCachedStates bounds how many sessions' states the engine holds: each
// is a live context, which the window bounds (a few hundred KB of text;
// images are refs).
const MaxCachedStates = 256

// stateCache holds each session's state as the engine last wrote it, so a
// turn reads the state back from the store only when the session moved on
// elsewhere (another replica; the log no longer ends where it did): a turn
// then costs what is new, not a decode of the whole live context.
type stateCache struct {
	mu    sync.Mutex
	m     map[stateKey]*list.Element // → *cachedState
	order *list.List                 // front: most recent
}

type stateKey struct {
	tenant string
	id     session.ID
}

type cachedState struct {
	key     stateKey
	created time.Time // a session deleted and made again under its ID is another
	seq     int64     // the log's last entry when the state was written
	st      session.State
	// memo is the session's upstream encodings: it checks what it copies,
	// so it serves a state read from the store as well.
	memo *wire.Memo
}

// started is what a turn starts from: the store's meta and the state,
// the state held (nil when the store's was newer) and the session's memo.
type started struct {
	meta session.Meta
	st   session.State
	held *cachedState
	memo *wire.Memo
}

func newStateCache() *stateCache {
	return &stateCache{m: map[stateKey]*list.Element{}, order: list.New()}
}

// load returns what a turn of the session starts from: the store's meta,
// and the state — the one held here when the store's log still ends
// where it did when it was written, else the store's.
func (c *stateCache) load(ctx context.Context, s session.Store, tenant string, id session.ID) (started, error) {
	k := stateKey{tenant, id}
	c.mu.Lock()
	var held *cachedState
	if el, ok := c.m[k]; ok {
		held = el.Value.(*cachedState)
	}
	c.mu.Unlock()
	known, m := int64(0), new(wire.Memo)
	if held != nil {
		known, m = held.seq, held.memo
	}
	cur, err := s.LoadState(ctx, tenant, id, known)
	if err != nil {
		return started{}, err
	}
	if cur.State == nil {
		if cur.Meta.Created.Equal(held.created) {
			st := cloneState(held.st)
			st.Encoded = nil // the turn makes its own (memo), from held
			return started{cur.Meta, st, held, m}, nil
		}
		if cur, err = s.LoadState(ctx, tenant, id, 0); err != nil {
			return started{}, err
		}
	}
	return started{cur.Meta, *cur.State, nil, m}, nil
}

// memo is the JSON memo for a live context about to be written: each
// message's encoding from the held state where the message is the same
// (session.State.Encoded), nil where it changed or is new; and how many
// lead the live context unchanged (session.State.Unchanged).
func memo(held *cachedState, live []chat.Message) (enc [][]byte, unchanged int) {
	enc = make([][]byte, len(live))
	if held == nil || len(held.st.Encoded) != len(held.st.Live) {
		return enc, 0
	}
	lead := true
	for i := range min(len(live), len(held.st.Live)) {
		if chat.Equal(live[i], held.st.Live[i]) {
			enc[i] = held.st.Encoded[i]
			if lead {
				unchanged++
			}
		} else {
			lead = false
		}
	}
	return enc, unchanged
}

// keep holds the state a turn wrote, with the log's last entry it wrote,
// and the session's memo.
func (c *stateCache) keep(meta session.Meta, seq int64, st session.State, m *wire.Memo) {
	k := stateKey{meta.Tenant, meta.ID}
	v := &cachedState{key: k, created: meta.Created, seq: seq, st: cloneState(st), memo: m}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[k]; ok {
		el.Value = v
		c.order.MoveToFront(el)
		return
	}
	c.m[k] = c.order.PushFront(v)
	for c.order.Len() > MaxCachedStates {
		delete(c.m, c.order.Remove(c.order.Back()).(*cachedState).key)
	}
}

// forget drops a session's state (its turn failed after the store may
// have moved on).
func (c *stateCache) forget(tenant string, id session.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.m[stateKey{tenant, id}]; ok {
		c.order.Remove(el)
		delete(c.m, stateKey{tenant, id})
	}
}

// cloneState is a copy of st that shares nothing a turn changes in place.
// The live messages are shared: a turn never changes a message in place
// (the policies and the engine's editors copy the ones they change, the
// invariant their tests hold), only the slice, which is clipped so that
// an append copies it. The JSON memo (Encoded) is shared too: it is
// filled in before the state is held and never written after.
func cloneState(st session.State) session.State {
	st.Live = slices.Clip(st.Live)
	if st.Turn != nil {
		t := *st.Turn
		t.Relays, t.Pending = slices.Clone(t.Relays), slices.Clone(t.Pending)
		st.Turn = &t
	}
	if st.Answered != nil {
		a := *st.Answered
		a.Reply = chat.CloneMessages([]chat.Message{a.Reply})[0]
		st.Answered = &a
	}
	return st
}
