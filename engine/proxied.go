package engine

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/imgctx/imgctx/session"
)

// proxiedCache holds the states of recent proxied conversations in front
// of the session store, so a request costs a map look-up, not a query
// (with a shared store, one read and one write: replicas see each other).
// The store is written at once when a decision changes (what later bodies
// carry); a change of the measurement base, the usage or the activity time
// only is written later (FlushProxied), since any earlier base still
// measures exactly and a lost one costs at most a measurement.
type proxiedCache struct {
	mu    sync.Mutex
	max   int
	m     map[string]*list.Element // tenant + "/" + key → *proxiedEntry
	order *list.List               // front: most recent
}

// proxiedEntry is one conversation. mu serialises its decisions (decide)
// and their recording (Close); the upstream call runs without it.
type proxiedEntry struct {
	tenant, key string
	mu          sync.Mutex
	loaded      bool
	st          session.Proxied     // the latest state
	stored      session.Proxied     // the state as last written
	storedAt    time.Time           // LastActivity as last written
	dirty       bool                // st has lazy changes not written yet
	handles     map[string]struct{} // recall handles written by this process
}

func (c *proxiedCache) entry(tenant, key string) *proxiedEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := tenant + "/" + key
	if el, ok := c.m[k]; ok {
		c.order.MoveToFront(el)
		return el.Value.(*proxiedEntry)
	}
	en := &proxiedEntry{tenant: tenant, key: key}
	c.m[k] = c.order.PushFront(en)
	for c.order.Len() > c.max {
		// The oldest goes; what it had not written yet is lazy by
		// definition.
		old := c.order.Remove(c.order.Back()).(*proxiedEntry)
		delete(c.m, old.tenant+"/"+old.key)
	}
	return en
}

func (c *proxiedCache) dirty() []*proxiedEntry {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*proxiedEntry
	for el := c.order.Front(); el != nil; el = el.Next() {
		out = append(out, el.Value.(*proxiedEntry))
	}
	return out
}

// load fills the entry from the store the first time — every time when
// the store is shared, since another replica may have decided since. The
// caller holds mu.
func (en *proxiedEntry) load(ctx context.Context, s session.Store) error {
	if _, shared := s.(session.Shared); en.loaded && !shared {
		return nil
	}
	st, err := s.LoadProxied(ctx, en.tenant, en.key)
	switch {
	case errors.Is(err, session.ErrNotFound):
		st = session.Proxied{TurnAt: -1}
	case err != nil:
		return fmt.Errorf("load proxied conversation: %w", err)
	}
	en.st, en.stored, en.storedAt, en.loaded = st, st, st.LastActivity, true
	return nil
}

// save records a new state: a shared store's is written now, every time
// (the next request may reach another replica, which must measure from
// this one's base); otherwise unwritten says it must be written, because
// its decisions changed or its activity time is a minute old in the
// store, and it is else marked for the next flush. The caller holds mu.
func (en *proxiedEntry) save(ctx context.Context, s session.Store, st session.Proxied) (unwritten bool, err error) {
	en.st = st
	if _, shared := s.(session.Shared); shared {
		return false, en.write(ctx, s)
	}
	if sameDecisions(st, en.stored) && st.LastActivity.Sub(en.storedAt) < time.Minute {
		en.dirty = true
		return false, nil
	}
	return true, nil
}

func (en *proxiedEntry) write(ctx context.Context, s session.Store) error {
	if err := s.SaveProxied(ctx, en.tenant, en.key, en.st); err != nil {
		return err
	}
	en.stored, en.storedAt, en.dirty = en.st, en.st.LastActivity, false
	return nil
}

// sameDecisions compares two states but for what may be written late: the
// measurement base, the usage, the counts and the activity time.
func sameDecisions(a, b session.Proxied) bool {
	if a.Model != b.Model || a.TurnAt != b.TurnAt || a.Keep.EngineBlind != b.Keep.EngineBlind || !slices.Equal(a.Images, b.Images) {
		return false
	}
	if (a.Turn == nil) != (b.Turn == nil) {
		return false
	}
	if a.Turn == nil {
		return true
	}
	x, y := *a.Turn, *b.Turn
	return x.Off == y.Off && x.Budget == y.Budget && x.Stopped == y.Stopped && x.Blind == y.Blind &&
		slices.Equal(x.Relays, y.Relays) && slices.Equal(x.Pending, y.Pending)
}

// Close lets go of the request bodies the engine holds to resume
// conversations from: each is the gateway's pooled buffer, which the
// gateway waits to reuse. The engine still serves; a conversation's next
// request is then read whole.
func (e *Engine) Close() {
	e.once.Do(e.init)
	e.spans.forgetResumes()
}

// FlushProxied writes what proxied conversations changed and did not write
// yet (their measurement bases and activity times). The gateway calls it
// every second and at shutdown.
func (e *Engine) FlushProxied(ctx context.Context) error {
	e.once.Do(e.init)
	var errs []error
	for _, en := range e.proxied.dirty() {
		en.mu.Lock()
		if en.dirty {
			errs = append(errs, en.write(ctx, e.Sessions))
		}
		en.mu.Unlock()
	}
	return errors.Join(errs...)
}
