package gateway

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/imgctx/imgctx/session"
)

// savesCounted is a session store that counts the proxied conversations'
// writes, and refuses them while failing is set.
type savesCounted struct {
	session.Store
	mu      sync.Mutex
	saves   int
	failing bool
}

func (s *savesCounted) SaveProxied(ctx context.Context, tenant, key string, p session.Proxied) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failing {
		return errors.New("the store is away")
	}
	s.saves++
	return s.Store.SaveProxied(ctx, tenant, key, p)
}

func (s *savesCounted) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.saves
}

// A request that changes no decision leaves its conversation's new
// measurement base, usage and activity time for later
// (engine.proxiedEntry.save): FlushProxied, which serve runs every second
// and at shutdown, writes them once, and a store that refuses them keeps
// them owed for the next flush — nothing is lost, nothing written twice.
func TestFlushProxiedWritesWhatRequestsLeftForLater(t *testing.T) {
	store := &savesCounted{Store: &session.Mem{}}
	g := newAgent(t, newAgentRig(t, 200_000, store), "Open the login page.")
	flush := func() error { return g.rig.server.engine.FlushProxied(context.Background()) }
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{tools: 1}) // a screenshot decided on: written behind the answer
	written, saves := g.decisions(), store.count()
	g.results(0, false, false)
	g.send(reply{tools: 1})
	g.results(0, false, false)
	g.send(reply{}) // two text steps of the same turn: nothing decided
	if now := g.decisions(); now.Messages != written.Messages || now.LastUsage != written.LastUsage || store.count() != saves {
		t.Fatalf("requests that decided nothing were written at once: %d messages (%d before), %d writes (%d before)",
			now.Messages, written.Messages, store.count(), saves)
	}
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	flushed := g.decisions()
	if flushed.Messages != written.Messages+4 || flushed.LastUsage == written.LastUsage || !flushed.LastActivity.After(written.LastActivity) {
		t.Fatalf("flushed %d messages, usage %+v at %v; the last request had %d messages, the stored state was %+v at %v",
			flushed.Messages, flushed.LastUsage, flushed.LastActivity, written.Messages+4, written.LastUsage, written.LastActivity)
	}
	if store.count() != saves+1 {
		t.Fatalf("the flush wrote %d times, not once", store.count()-saves)
	}
	if err := flush(); err != nil || store.count() != saves+1 {
		t.Fatalf("a flush with nothing owed wrote %d times (err %v)", store.count()-saves-1, err)
	}

	g.results(0, false, false)
	g.send(reply{})
	store.mu.Lock()
	store.failing = true
	store.mu.Unlock()
	if err := flush(); err == nil {
		t.Fatal("a flush the store refused reported no error")
	}
	store.mu.Lock()
	store.failing = false
	store.mu.Unlock()
	if err := flush(); err != nil {
		t.Fatal(err)
	}
	if got := g.decisions(); got.Messages != flushed.Messages+2 {
		t.Fatalf("after a refused flush and another, the store holds %d messages; the last request had %d", got.Messages, flushed.Messages+2)
	}
}
