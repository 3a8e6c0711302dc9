// Package sessiontest is the conformance suite for session.Store
// implementations.
package sessiontest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/session"
)

// Harness tells the suite how to build the store under test.
type Harness struct {
	// New returns an empty store.
	New func(t *testing.T) session.Store
	// Reopen, when set, returns a new store over the same storage as the
	// last one New returned, as a restarted process would.
	Reopen func(t *testing.T) session.Store
}

func msg(role chat.Role, parts ...chat.Part) *chat.Message {
	return &chat.Message{Role: role, Parts: parts}
}

// sampleLog is a turn with a kept tool screenshot, and a compaction.
func sampleLog() ([]session.Entry, session.State) {
	shot := chat.Image{Ref: blob.Of([]byte("shot")), MediaType: "image/png", Bytes: 1234, Width: 1280, Height: 800,
		Origin: chat.FromTool, Keep: chat.Kept, Cost: 1334, Caption: "login form"}
	entries := []session.Entry{
		{Message: msg(chat.User, chat.Text{Text: "open the login page"})},
		{Message: msg(chat.Assistant, chat.ToolCall{ID: "c1", Name: "screenshot", Arguments: `{"full":true}`})},
		{Message: msg(chat.Tool, chat.ToolResult{CallID: "c1", Name: "screenshot", Parts: []chat.Part{chat.Text{Text: "ok"}, shot}})},
		{Message: msg(chat.Assistant, chat.Text{Text: "I see a login form."})},
		{Compaction: &policy.CompactionRecord{From: 0, To: 2, Summary: "the user asked for the login page", TotalChars: 900, PrefixChars: 700,
			Slimmed: policy.SlimStats{Images: 1}}},
	}
	live := []chat.Message{
		{Role: chat.User, Parts: []chat.Part{chat.Summary{Text: "the user asked for the login page", From: 0, To: 2}}},
		*entries[2].Message, *entries[3].Message,
	}
	st := session.State{
		Live:         live,
		Keep:         policy.KeepState{EngineBlind: false, Base: policy.Base{Valid: true, Prompt: 4321, Messages: 3}},
		LastUsage:    chat.Usage{Prompt: 4321, CacheRead: 4000, CacheWrite: 200, Output: 12},
		LastActivity: time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC),
		TurnStart:    1,
		TurnOpen:     true,
		Turn: &policy.TurnSnapshot{Budget: 18666, Base: policy.Base{Valid: true, Prompt: 4321, Messages: 3},
			Relays: []policy.RelaySnapshot{{Occ: 1, Ref: shot.Ref, Bytes: 1234, Keep: chat.Kept, Cost: 1334, Observed: true}}},
	}
	return entries, st
}

// sampleProxied is a proxied conversation mid-turn: a kept screenshot, a
// removed one, a trial relay of the open turn.
func sampleProxied() session.Proxied {
	a, b := blob.Of([]byte("a")), blob.Of([]byte("b"))
	return session.Proxied{Model: "claude-sonnet-4-6", Messages: 7, TurnAt: 4,
		Turn: &policy.TurnSnapshot{Budget: 900, Base: policy.Base{Valid: true, Prompt: 5000, Messages: 5},
			Relays: []policy.RelaySnapshot{{Occ: 1, Ref: b, Bytes: 77, Keep: chat.Trial}}, Pending: []int{1}},
		Images: []session.Decided{
			{Msg: 2, Part: 0, Nested: 1, Ref: a, Keep: chat.Kept, Cost: 1334},
			{Msg: 3, Part: 1, Nested: -1, Ref: b, Keep: chat.Removed, Reason: "overflow"},
			{Msg: 6, Part: 0, Nested: 0, Ref: b, Keep: chat.Trial, Occ: 1},
		},
		Keep: policy.KeepState{Base: policy.Base{Valid: true, Prompt: 5000, Messages: 5}}, LastUsage: chat.Usage{Prompt: 5000, Output: 12},
		LastActivity: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)}
}

func stripSeq(es []session.Entry) []session.Entry {
	out := make([]session.Entry, len(es))
	for i, e := range es {
		out[i] = session.Entry{Message: e.Message, Compaction: e.Compaction}
	}
	return out
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	ctx := context.Background()
	meta := session.Meta{Tenant: "alpha", Thread: chat.Main, Settings: chat.Settings{Model: "claude-sonnet-4-6", KeepTurnImages: true}}

	t.Run("ping answers", func(t *testing.T) {
		if err := h.New(t).Ping(t.Context()); err != nil {
			t.Fatalf("Ping: %v", err)
		}
	})
	t.Run("create then load", func(t *testing.T) {
		s := h.New(t)
		m, err := s.Create(ctx, meta)
		if err != nil {
			t.Fatal(err)
		}
		if m.ID == "" || m.Created.IsZero() {
			t.Fatalf("meta %+v", m)
		}
		snap, err := s.Load(ctx, "alpha", m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if snap.Meta.Thread != chat.Main || snap.Meta.Settings != meta.Settings || len(snap.Log) != 0 || snap.State.Live != nil {
			t.Fatalf("snapshot %+v", snap)
		}
		if _, err := s.Create(ctx, session.Meta{Tenant: "alpha", ID: m.ID}); err == nil {
			t.Fatal("duplicate id accepted")
		}
		if _, err := s.Create(ctx, session.Meta{Tenant: "../etc"}); err == nil {
			t.Fatal("bad tenant accepted")
		}
	})

	t.Run("append round-trips log and state exactly", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		entries, st := sampleLog()
		stored, err := s.Append(ctx, "alpha", m.ID, entries[:2], session.State{Live: []chat.Message{*entries[0].Message}})
		if err != nil {
			t.Fatal(err)
		}
		if stored[0].Seq != 1 || stored[1].Seq != 2 {
			t.Fatalf("seqs %d %d", stored[0].Seq, stored[1].Seq)
		}
		if _, err := s.Append(ctx, "alpha", m.ID, entries[2:], st); err != nil {
			t.Fatal(err)
		}
		snap, err := s.Load(ctx, "alpha", m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(stripSeq(snap.Log), entries) {
			t.Fatalf("log differs:\n%+v", snap.Log)
		}
		for i, e := range snap.Log {
			if e.Seq != int64(i+1) || e.At.IsZero() {
				t.Fatalf("entry %d: seq %d at %v", i, e.Seq, e.At)
			}
		}
		if !reflect.DeepEqual(snap.State, st) {
			t.Fatalf("state differs:\n got %+v\nwant %+v", snap.State, st)
		}
		if !snap.Meta.Updated.After(snap.Meta.Created) && !snap.Meta.Updated.Equal(snap.Meta.Created) {
			t.Fatal("updated before created")
		}
	})

	t.Run("a turn's state is read only when the log moved", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		cur, err := s.LoadState(ctx, "alpha", m.ID, 0)
		if err != nil {
			t.Fatal(err)
		}
		if cur.Seq != 0 || cur.State == nil || cur.State.Live != nil || cur.Meta.Settings != meta.Settings {
			t.Fatalf("a new session: %+v", cur)
		}
		entries, st := sampleLog()
		// A memo of the first message's JSON is used as given; the others
		// are encoded and filled in.
		first, _ := json.Marshal(st.Live[0])
		st.Encoded = [][]byte{first, nil, nil}
		if _, err := s.Append(ctx, "alpha", m.ID, entries, st); err != nil {
			t.Fatal(err)
		}
		if st.Encoded[1] == nil || st.Encoded[2] == nil {
			t.Fatal("the memo was not filled in")
		}
		st.Encoded = nil
		cur, err = s.LoadState(ctx, "alpha", m.ID, 2)
		if err != nil {
			t.Fatal(err)
		}
		if cur.Seq != int64(len(entries)) || cur.State == nil || !reflect.DeepEqual(*cur.State, st) {
			t.Fatalf("the log moved past 2: got seq %d, state %+v", cur.Seq, cur.State)
		}
		cur, err = s.LoadState(ctx, "alpha", m.ID, cur.Seq)
		if err != nil || cur.State != nil || cur.Seq != int64(len(entries)) || cur.Meta.ID != m.ID {
			t.Fatalf("the log still ends where the caller knew: %+v, %v", cur, err)
		}
		if _, err := s.LoadState(ctx, "beta", m.ID, 0); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("another tenant's session: %v", err)
		}
		if _, err := s.LoadState(ctx, "alpha", "s_missing", 0); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("a missing session: %v", err)
		}
	})

	t.Run("the live messages a turn left alone stay as they were", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		entries, st := sampleLog()
		if _, err := s.Append(ctx, "alpha", m.ID, entries[:2], st); err != nil {
			t.Fatal(err)
		}
		// The next turn keeps the first message, rewrites the second (an
		// image removed), drops the third and adds two.
		next := st
		next.Live = []chat.Message{st.Live[0], *msg(chat.Tool, chat.Marker{Of: "image", Reason: "budget"}),
			*entries[1].Message, *entries[3].Message}
		next.Unchanged = 1
		if _, err := s.Append(ctx, "alpha", m.ID, entries[2:4], next); err != nil {
			t.Fatal(err)
		}
		next.Unchanged = 0
		snap, err := s.Load(ctx, "alpha", m.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(snap.State, next) {
			t.Fatalf("state after a partial rewrite:\n got %+v\nwant %+v", snap.State.Live, next.Live)
		}
		cur, err := s.LoadState(ctx, "alpha", m.ID, 0)
		if err != nil || !reflect.DeepEqual(*cur.State, next) {
			t.Fatalf("LoadState after a partial rewrite: %+v, %v", cur.State, err)
		}
		// Shorter again: the rows past the new end go.
		last := next
		last.Live = []chat.Message{st.Live[0], *entries[0].Message}
		last.Unchanged = 1
		if _, err := s.Append(ctx, "alpha", m.ID, entries[4:], last); err != nil {
			t.Fatal(err)
		}
		last.Unchanged = 0
		if snap, _ = s.Load(ctx, "alpha", m.ID); !reflect.DeepEqual(snap.State, last) {
			t.Fatalf("state after shrinking:\n got %+v\nwant %+v", snap.State.Live, last.Live)
		}
	})

	t.Run("a bad entry appends nothing", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		entries, st := sampleLog()
		bad := append(entries[:1:1], session.Entry{})
		if _, err := s.Append(ctx, "alpha", m.ID, bad, st); err == nil {
			t.Fatal("an empty entry was accepted")
		}
		snap, _ := s.Load(ctx, "alpha", m.ID)
		if len(snap.Log) != 0 || snap.State.Live != nil {
			t.Fatal("a refused append left a partial write")
		}
	})

	t.Run("tenants are isolated", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		if _, err := s.Load(ctx, "beta", m.ID); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("other tenant load: %v", err)
		}
		if _, err := s.Append(ctx, "beta", m.ID, nil, session.State{}); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("other tenant append: %v", err)
		}
		if err := s.Delete(ctx, "beta", m.ID); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("other tenant delete: %v", err)
		}
		if l, _ := s.List(ctx, "beta"); len(l) != 0 {
			t.Fatalf("other tenant lists %d", len(l))
		}
		if _, err := s.Load(ctx, "alpha", m.ID); err != nil {
			t.Fatal("the owner lost its session")
		}
	})

	t.Run("list and delete", func(t *testing.T) {
		s := h.New(t)
		var ids []session.ID
		for range 3 {
			m, _ := s.Create(ctx, meta)
			ids = append(ids, m.ID)
		}
		l, err := s.List(ctx, "alpha")
		if err != nil || len(l) != 3 {
			t.Fatalf("list %d, %v", len(l), err)
		}
		if err := s.Delete(ctx, "alpha", ids[1]); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Load(ctx, "alpha", ids[1]); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("deleted session loads: %v", err)
		}
		if err := s.Delete(ctx, "alpha", ids[1]); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
		if l, _ := s.List(ctx, "alpha"); len(l) != 2 {
			t.Fatalf("list after delete: %d", len(l))
		}
	})

	t.Run("concurrent appends keep every entry once, in order per session", func(t *testing.T) {
		s := h.New(t)
		var sessions []session.ID
		for range 4 {
			m, _ := s.Create(ctx, meta)
			sessions = append(sessions, m.ID)
		}
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		for _, id := range sessions {
			for w := range 4 {
				wg.Go(func() {
					for i := range 5 {
						e := session.Entry{Message: msg(chat.User, chat.Text{Text: fmt.Sprintf("w%d-%d", w, i)})}
						if _, err := s.Append(ctx, "alpha", id, []session.Entry{e}, session.State{TurnStart: i}); err != nil {
							errs <- err
						}
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for _, id := range sessions {
			snap, _ := s.Load(ctx, "alpha", id)
			if len(snap.Log) != 20 {
				t.Fatalf("%d entries; want 20", len(snap.Log))
			}
			for i, e := range snap.Log {
				if e.Seq != int64(i+1) {
					t.Fatalf("seq %d at %d", e.Seq, i)
				}
			}
		}
	})

	t.Run("export is lossless", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		entries, st := sampleLog()
		s.Append(ctx, "alpha", m.ID, entries, st)
		snap, _ := s.Load(ctx, "alpha", m.ID)
		var buf bytes.Buffer
		if err := session.ExportJSONL(&buf, snap); err != nil {
			t.Fatal(err)
		}
		back, err := session.ImportJSONL(bytes.NewReader(buf.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		snap.Meta.Created, snap.Meta.Updated = snap.Meta.Created.UTC(), snap.Meta.Updated.UTC()
		for i := range snap.Log {
			snap.Log[i].At = snap.Log[i].At.UTC()
		}
		if !reflect.DeepEqual(back, snap) {
			t.Fatalf("export round trip differs:\n got %+v\nwant %+v", back, snap)
		}
	})

	t.Run("settings change, for the tenant only", func(t *testing.T) {
		s := h.New(t)
		m, _ := s.Create(ctx, meta)
		want := chat.Settings{Model: "claude-opus-4-1", KeepTurnImages: false}
		got, err := s.SetSettings(ctx, "alpha", m.ID, want)
		if err != nil || got.Settings != want || got.ID != m.ID || got.Thread != m.Thread {
			t.Fatalf("set settings: %v %+v", err, got)
		}
		if snap, _ := s.Load(ctx, "alpha", m.ID); snap.Meta.Settings != want {
			t.Fatalf("loaded settings %+v", snap.Meta.Settings)
		}
		if _, err := s.SetSettings(ctx, "beta", m.ID, want); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("another tenant changed alpha's session: %v", err)
		}
	})

	t.Run("proxied decisions round-trip, per tenant, and expire when idle", func(t *testing.T) {
		s := h.New(t)
		if _, err := s.LoadProxied(ctx, "alpha", "k1"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("an unknown key: %v", err)
		}
		p := sampleProxied()
		if err := s.SaveProxied(ctx, "alpha", "k1", p); err != nil {
			t.Fatal(err)
		}
		got, err := s.LoadProxied(ctx, "alpha", "k1")
		if err != nil || !reflect.DeepEqual(got, p) {
			t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, got, p)
		}
		if _, err := s.LoadProxied(ctx, "beta", "k1"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("another tenant read alpha's decisions: %v", err)
		}
		p.Messages = 9
		if err := s.SaveProxied(ctx, "alpha", "k1", p); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.LoadProxied(ctx, "alpha", "k1"); got.Messages != 9 {
			t.Fatalf("a save did not replace: %+v", got)
		}
		if n, err := s.ActiveProxied(ctx, time.Now().Add(-time.Hour)); err != nil || n != 1 {
			t.Fatalf("%d active conversations, want 1 (%v)", n, err)
		}
		if n, err := s.ActiveProxied(ctx, time.Now().Add(time.Hour)); err != nil || n != 0 {
			t.Fatalf("%d conversations active in the future (%v)", n, err)
		}
		if n, err := s.ExpireProxied(ctx, time.Now().Add(-time.Hour)); err != nil || n != 0 {
			t.Fatalf("expired %d fresh conversations (%v)", n, err)
		}
		if n, err := s.ExpireProxied(ctx, time.Now().Add(time.Hour)); err != nil || n != 1 {
			t.Fatalf("expired %d idle conversations, want 1 (%v)", n, err)
		}
		if _, err := s.LoadProxied(ctx, "alpha", "k1"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("an expired conversation still loads: %v", err)
		}
	})

	t.Run("recall handles resolve in their tenant, keep what they first said, and go with their conversation", func(t *testing.T) {
		s := h.New(t)
		at := time.Unix(0, time.Now().Add(-time.Hour).UnixNano()).UTC()
		a := session.Recall{Handle: "ia1", Conversation: "k1", Ref: blob.Of([]byte("a")), MediaType: "image/png",
			Caption: `after "click Save"`, Reason: "budget", Model: "claude-sonnet-4-6", Removed: at}
		b := a
		b.Handle, b.Ref, b.Removed = "ib2", blob.Of([]byte("b")), at.Add(time.Second)
		other := a
		other.Handle, other.Conversation = "ic3", "k2"
		if err := s.SaveRecalls(ctx, "alpha", []session.Recall{a, b, other}); err != nil {
			t.Fatal(err)
		}
		if got, err := s.LoadRecall(ctx, "alpha", "ia1"); err != nil || !reflect.DeepEqual(got, a) {
			t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, got, a)
		}
		if _, err := s.LoadRecall(ctx, "beta", "ia1"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("another tenant resolved alpha's handle: %v", err)
		}
		changed := a
		changed.Reason = "window"
		if err := s.SaveRecalls(ctx, "alpha", []session.Recall{changed}); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.LoadRecall(ctx, "alpha", "ia1"); got.Reason != "budget" {
			t.Fatalf("a handle was rewritten: %+v", got)
		}
		list, err := s.ListRecalls(ctx, "alpha", "k1")
		if err != nil || len(list) != 2 || list[0].Handle != "ib2" || list[1].Handle != "ia1" {
			t.Fatalf("list of k1, newest first: %v %+v", err, list)
		}
		if list, _ := s.ListRecalls(ctx, "beta", "k1"); len(list) != 0 {
			t.Fatalf("another tenant listed alpha's recalls: %+v", list)
		}
		// k1 is a live proxied conversation; k2 has none: it goes when idle.
		if err := s.SaveProxied(ctx, "alpha", "k1", sampleProxied()); err != nil {
			t.Fatal(err)
		}
		if _, err := s.ExpireProxied(ctx, time.Now().Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.LoadRecall(ctx, "alpha", "ia1"); err != nil {
			t.Fatalf("a live conversation's handle expired: %v", err)
		}
		if _, err := s.LoadRecall(ctx, "alpha", "ic3"); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("a handle of no live conversation stayed: %v", err)
		}
		if _, err := s.ExpireProxied(ctx, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if list, _ := s.ListRecalls(ctx, "alpha", "k1"); len(list) != 0 {
			t.Fatalf("an expired conversation's handles stayed: %+v", list)
		}
	})

	t.Run("provider files are found by upstream, credential, wire and image; stale ones listed least used first", func(t *testing.T) {
		s := h.New(t)
		old := time.Unix(0, time.Now().Add(-2*time.Hour).UnixNano()).UTC()
		a := session.ProviderFile{FileKey: session.FileKey{Upstream: "https://api.anthropic.com", Credential: "fp-a", Wire: "anthropic", Ref: blob.Of([]byte("a"))},
			ID: "file_a", Uploaded: old, Used: old}
		if err := s.SaveFile(ctx, a); err != nil {
			t.Fatal(err)
		}
		if got, err := s.LoadFile(ctx, a.FileKey); err != nil || !reflect.DeepEqual(got, a) {
			t.Fatalf("round trip: %v\n got %+v\nwant %+v", err, got, a)
		}
		for _, other := range []session.FileKey{
			{Upstream: a.Upstream, Credential: "fp-b", Wire: a.Wire, Ref: a.Ref}, // another credential
			{Upstream: "https://other", Credential: "fp-a", Wire: a.Wire, Ref: a.Ref},
			{Upstream: a.Upstream, Credential: "fp-a", Wire: "responses", Ref: a.Ref},
			{Upstream: a.Upstream, Credential: "fp-a", Wire: a.Wire, Ref: blob.Of([]byte("b"))},
		} {
			if _, err := s.LoadFile(ctx, other); !errors.Is(err, session.ErrNotFound) {
				t.Fatalf("%+v found a's file: %v", other, err)
			}
		}
		// b is used now but expires in an hour; c used now, no expiry.
		now := time.Unix(0, time.Now().UnixNano()).UTC()
		b := session.ProviderFile{FileKey: session.FileKey{Upstream: a.Upstream, Credential: "fp-a", Wire: "gemini", Ref: a.Ref},
			ID: "files/b", URI: "https://g/files/b", Expires: now.Add(time.Hour), Uploaded: now, Used: now}
		c := b
		c.Wire, c.ID, c.URI, c.Expires = "responses", "file-c", "", time.Time{}
		for _, f := range []session.ProviderFile{b, c} {
			if err := s.SaveFile(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		stale, err := s.StaleFiles(ctx, now.Add(-time.Minute))
		if err != nil || len(stale) != 1 || stale[0].ID != "file_a" {
			t.Fatalf("stale a minute ago: %v %+v", err, stale)
		}
		stale, _ = s.StaleFiles(ctx, now.Add(time.Minute).Add(time.Hour))
		if len(stale) != 3 || stale[0].ID != "file_a" {
			t.Fatalf("stale past b's expiry, least used first: %+v", stale)
		}
		// Using a again moves it out of the stale list; deleting forgets it.
		a.Used = now
		if err := s.SaveFile(ctx, a); err != nil {
			t.Fatal(err)
		}
		if stale, _ := s.StaleFiles(ctx, now.Add(-time.Minute)); len(stale) != 0 {
			t.Fatalf("a used file stayed stale: %+v", stale)
		}
		if err := s.DeleteFile(ctx, a.FileKey); err != nil {
			t.Fatal(err)
		}
		if _, err := s.LoadFile(ctx, a.FileKey); !errors.Is(err, session.ErrNotFound) {
			t.Fatalf("a deleted file was found: %v", err)
		}
		if err := s.DeleteFile(ctx, a.FileKey); err != nil {
			t.Fatalf("deleting a missing file: %v", err)
		}
	})

	t.Run("the request log answers within its tenant, newest first, and trims by age and rows", func(t *testing.T) {
		s := h.New(t)
		at := time.Unix(0, time.Now().Add(-time.Hour).UnixNano()).UTC()
		line := func(i int, tenant, conv, model string) session.Request {
			return session.Request{ID: fmt.Sprintf("r%d", i), UpstreamID: fmt.Sprintf("up%d", i), Time: at.Add(time.Duration(i) * time.Minute),
				Tenant: tenant, Conversation: conv, Route: "messages", Wire: "anthropic", Model: model, Status: 200, DurationMS: 12.5,
				Input: 1000 + i, CacheRead: 800, CacheWrite: 100, Output: 50, Dollars: 0.0042, Priced: true, BytesIn: 4096, BytesOut: 512,
				Images:  []session.ImageFate{{Ref: blob.Of([]byte("a")), Sent: true, Width: 1280, Height: 800}, {Ref: blob.Of([]byte("b")), Reason: "budget"}},
				Removed: 1, Break: true, BreakCause: "image"}
		}
		var all []session.Request
		for i := range 6 {
			conv, model := "k1", "claude-sonnet-4-6"
			if i%2 == 1 {
				conv, model = "k2", "gpt-4o"
			}
			all = append(all, line(i, "alpha", conv, model))
		}
		all = append(all, line(6, "beta", "k1", "gpt-4o"))
		if err := s.AppendRequests(ctx, all[:3]); err != nil {
			t.Fatal(err)
		}
		if err := s.AppendRequests(ctx, all[3:]); err != nil {
			t.Fatal(err)
		}
		ids := func(rs []session.Request) string {
			out := ""
			for _, r := range rs {
				out += r.ID + " "
			}
			return out
		}
		for _, c := range []struct {
			f    session.RequestFilter
			want string
		}{
			{session.RequestFilter{Tenant: "alpha"}, "r5 r4 r3 r2 r1 r0 "},
			{session.RequestFilter{Tenant: "beta"}, "r6 "},
			{session.RequestFilter{Tenant: "gamma"}, ""},
			{session.RequestFilter{Tenant: "alpha", Conversation: "k1"}, "r4 r2 r0 "},
			{session.RequestFilter{Tenant: "alpha", Model: "gpt-4o"}, "r5 r3 r1 "},
			{session.RequestFilter{Tenant: "alpha", Since: at.Add(3 * time.Minute)}, "r5 r4 r3 "},
			{session.RequestFilter{Tenant: "alpha", ID: "up2"}, "r2 "},
			{session.RequestFilter{Tenant: "alpha", ID: "r6"}, ""},
			{session.RequestFilter{Tenant: "alpha", Limit: 2}, "r5 r4 "},
		} {
			got, err := s.ListRequests(ctx, c.f)
			if err != nil || ids(got) != c.want {
				t.Errorf("%+v: %v %q, want %q", c.f, err, ids(got), c.want)
			}
		}
		got, _ := s.ListRequests(ctx, session.RequestFilter{Tenant: "alpha", ID: "r4"})
		if len(got) != 1 || !reflect.DeepEqual(got[0], all[4]) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", got, all[4])
		}
		// The sums, by model (the lines may straddle an hour: summed here).
		totals, err := s.SumRequests(ctx, "alpha", time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		by := map[string]session.Totals{}
		for i, tot := range totals {
			if i > 0 && tot.Hour.Before(totals[i-1].Hour) || tot.Hour.Minute() != 0 {
				t.Fatalf("sums not by hour, oldest first: %+v", totals)
			}
			b := by[tot.Model]
			b.Requests, b.Input, b.CacheRead, b.CacheWrite, b.Output = b.Requests+tot.Requests, b.Input+tot.Input, b.CacheRead+tot.CacheRead, b.CacheWrite+tot.CacheWrite, b.Output+tot.Output
			b.Dollars, b.Sent, b.NotSent, b.Breaks = b.Dollars+tot.Dollars, b.Sent+tot.Sent, b.NotSent+tot.NotSent, b.Breaks+tot.Breaks
			by[tot.Model] = b
		}
		for model, input := range map[string]int64{"claude-sonnet-4-6": 1000 + 1002 + 1004, "gpt-4o": 1001 + 1003 + 1005} {
			b := by[model]
			if b.Requests != 3 || b.Input != input || b.CacheRead != 2400 || b.CacheWrite != 300 || b.Output != 150 ||
				b.Sent != 3 || b.NotSent != 3 || b.Breaks != 3 || b.Dollars < 0.0125 || b.Dollars > 0.0127 {
				t.Errorf("%s: %+v", model, b)
			}
		}
		if totals, _ := s.SumRequests(ctx, "alpha", at.Add(5*time.Minute)); len(totals) != 1 || totals[0].Requests != 1 || totals[0].Model != "gpt-4o" {
			t.Errorf("since the 6th line: %+v", totals)
		}
		if totals, _ := s.SumRequests(ctx, "gamma", time.Time{}); len(totals) != 0 {
			t.Errorf("another tenant's sums: %+v", totals)
		}
		left, err := s.TrimRequests(ctx, at.Add(2*time.Minute), 0)
		if err != nil || left != 5 {
			t.Fatalf("trim by age: %v, %d left, want 5", err, left)
		}
		left, err = s.TrimRequests(ctx, time.Time{}, 3)
		if err != nil || left != 3 {
			t.Fatalf("trim by rows: %v, %d left, want 3", err, left)
		}
		if got, _ := s.ListRequests(ctx, session.RequestFilter{Tenant: "alpha"}); ids(got) != "r5 r4 " {
			t.Fatalf("after trimming, alpha has %q, want the newest: r5 r4", ids(got))
		}
	})

	t.Run("a large batch of the request log keeps every line, in order", func(t *testing.T) {
		s := h.New(t)
		at := time.Unix(0, time.Now().Add(-time.Hour).UnixNano()).UTC()
		// Over two of any store's statements' worth of lines, and a rest.
		var all []session.Request
		for i := range 37 {
			all = append(all, session.Request{ID: fmt.Sprintf("r%02d", i), Time: at.Add(time.Duration(i) * time.Second), Tenant: "alpha",
				Conversation: fmt.Sprintf("k%d", i%3), Route: "chat_completions", Wire: "openai", Model: "gpt-4o", Status: 200, Input: 100 + i, Output: i})
		}
		if err := s.AppendRequests(ctx, all); err != nil {
			t.Fatal(err)
		}
		got, err := s.ListRequests(ctx, session.RequestFilter{Tenant: "alpha", Limit: 100})
		if err != nil || len(got) != len(all) {
			t.Fatalf("%v: %d lines, want %d", err, len(got), len(all))
		}
		for i, r := range got {
			if want := all[len(all)-1-i]; !reflect.DeepEqual(r, want) {
				t.Fatalf("line %d, newest first:\n got %+v\nwant %+v", i, r, want)
			}
		}
	})

	if h.Reopen != nil {
		t.Run("a restarted process resumes exactly", func(t *testing.T) {
			s := h.New(t)
			m, _ := s.Create(ctx, meta)
			entries, st := sampleLog()
			if _, err := s.Append(ctx, "alpha", m.ID, entries, st); err != nil {
				t.Fatal(err)
			}
			before, _ := s.Load(ctx, "alpha", m.ID)
			after, err := h.Reopen(t).Load(ctx, "alpha", m.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(before, after) {
				t.Fatalf("after restart:\n got %+v\nwant %+v", after, before)
			}
			if err := s.SaveProxied(ctx, "alpha", "k1", sampleProxied()); err != nil {
				t.Fatal(err)
			}
			if got, err := h.Reopen(t).LoadProxied(ctx, "alpha", "k1"); err != nil || !reflect.DeepEqual(got, sampleProxied()) {
				t.Fatalf("proxied decisions after restart: %v %+v", err, got)
			}
		})
	}
}
