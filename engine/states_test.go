package engine

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
)

// The state an engine holds between turns is used only while the store's
// log ends where that engine left it: a turn another process ran on the
// session, or a session deleted and made again under the same ID (its
// log as long again), is read from the store.
func TestHeldStateFollowsTheStore(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 200_000,
		reply{text: "answer one"}, reply{text: "answer two"}, reply{text: "answer three"}, reply{text: "answer four"}, reply{text: "answer five"}, reply{text: "answer six"}, reply{text: "answer seven"})
	id := r.session(t, true)
	r.call(t, id, user("turn one"))
	other := r.open(t) // another process on the same data
	if _, err := other.Call(t.Context(), "acme", id, user("turn two")); err != nil {
		t.Fatal(err)
	}
	r.call(t, id, user("turn three"))
	third := r.up.requests[2]
	for _, want := range []string{"turn one", "answer one", "turn two", "answer two", "turn three"} {
		if !bytes.Contains(third, []byte(want)) {
			t.Fatalf("the third turn's request lacks %q (another process's turn lost):\n%s", want, third)
		}
	}

	// Deleted and made again under its ID, then moved on elsewhere to the
	// log's length this engine last wrote (6): a new session all the same.
	meta, err := r.engine.Sessions.Load(t.Context(), "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.engine.Sessions.Delete(t.Context(), "acme", id); err != nil {
		t.Fatal(err)
	}
	if _, err := r.engine.Sessions.Create(t.Context(), session.Meta{ID: id, Tenant: "acme", Thread: chat.Main, Settings: meta.Meta.Settings}); err != nil {
		t.Fatal(err)
	}
	for _, ask := range []string{"anew", "anew again", "anew once more"} {
		if _, err := other.Call(t.Context(), "acme", id, user(ask)); err != nil {
			t.Fatal(err)
		}
	}
	if cur, err := r.engine.Sessions.LoadState(t.Context(), "acme", id, 0); err != nil || cur.Seq != 6 {
		t.Fatalf("the made-again session's log: %d entries, %v (the test needs 6)", cur.Seq, err)
	}
	r.call(t, id, user("turn six"))
	last := r.up.requests[len(r.up.requests)-1]
	if bytes.Contains(last, []byte("turn one")) || !bytes.Contains(last, []byte("anew once more")) {
		t.Fatalf("the made-again session's turn started from the old one's state:\n%s", last)
	}
}

// appendThenFail is a session store whose next Append writes and then
// reports an error, as a commit whose answer was lost does.
type appendThenFail struct {
	session.Store
	armed bool
}

func (s *appendThenFail) Append(ctx context.Context, tenant string, id session.ID, entries []session.Entry, st session.State) ([]session.Entry, error) {
	out, err := s.Store.Append(ctx, tenant, id, entries, st)
	if err == nil && s.armed {
		s.armed = false
		return nil, errors.New("connection reset after the commit")
	}
	return out, err
}

// A turn whose write was reported failed may have been written: the next
// turn starts from what the store holds, not from what the engine held
// before it — here the turn that was written after all, and once.
func TestATurnWrittenButReportedFailedIsReadBack(t *testing.T) {
	r := newRig(t, upstream.Anthropic, 200_000, reply{text: "answer one"}, reply{text: "answer two"}, reply{text: "answer three"})
	store := &appendThenFail{Store: r.engine.Sessions}
	r.engine.Sessions = store
	id := r.session(t, true)
	r.call(t, id, user("turn one"))
	store.armed = true
	if _, err := r.engine.Call(t.Context(), "acme", id, user("turn two")); err == nil {
		t.Fatal("a turn the store reported failed answered without an error")
	}
	r.call(t, id, user("turn three"))
	third := r.up.requests[2]
	for _, want := range []string{"turn one", "answer one", "turn two", "answer two", "turn three"} {
		if bytes.Count(third, []byte(want)) != 1 {
			t.Fatalf("the third turn's request holds %q %d times, want once:\n%s", want, bytes.Count(third, []byte(want)), third)
		}
	}
}
