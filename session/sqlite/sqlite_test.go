package sqlite

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sessiontest"
)

func TestConformanceSQLite(t *testing.T) {
	var path string
	open := func(t *testing.T) session.Store {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	sessiontest.Run(t, sessiontest.Harness{
		New: func(t *testing.T) session.Store {
			path = filepath.Join(t.TempDir(), "imgctx.db")
			return open(t)
		},
		Reopen: open,
	})
}

func TestMigrationsApplyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "imgctx.db")
	for range 2 {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		files, _ := fs.Glob(migrations, "migrations/*.sql")
		if err := s.db.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(files) || n < 2 {
			t.Fatalf("%d migrations recorded, %v", n, err)
		}
		var mode string
		s.db.QueryRow(`PRAGMA journal_mode`).Scan(&mode)
		if mode != "wal" {
			t.Fatalf("journal mode %q; want wal", mode)
		}
		s.Close()
	}
}

// Regression (issue "Hardening", item 9): the database was created 0644
// while images are 0600.
func TestDatabaseIsOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "imgctx.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}

// BenchmarkAppendRequests writes the request log as the gateway does: a
// batch of 256 lines of a text request (no images) in one transaction,
// each batch a millisecond or more after the one before, into a log that
// grows as the benchmark runs. The ids are random (ids=random, as the
// gateway made them before) or ordered by time (ids=by-time, as it makes
// them now): the id index, until schema version 7 dropped it, took random
// ones into a leaf each (17 µs a line against 11).
func BenchmarkAppendRequests(b *testing.B) {
	for _, ordered := range []bool{false, true} {
		b.Run(map[bool]string{false: "ids=random", true: "ids=by-time"}[ordered], func(b *testing.B) {
			s, err := Open(filepath.Join(b.TempDir(), "imgctx.db"))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			batch := make([]session.Request, 256)
			for i := range batch {
				batch[i] = session.Request{Tenant: "default", Conversation: "e208cda9febccd82f9652565e3cf43f229c65c4682cbabc91cd6c20763800e71",
					Route: "chat_completions", Wire: "openai", Model: "gpt-4o", Profile: "gpt-4o", Upstream: "default", Status: 200, DurationMS: 0.5,
					Input: 120, Output: 5, Dollars: 0.0003, Priced: true, BytesIn: 1010, BytesOut: 300}
			}
			rng := rand.New(rand.NewPCG(1, 2))
			b.ReportAllocs()
			for b.Loop() {
				now := time.Now()
				for i := range batch {
					batch[i].Time = now
					batch[i].ID = fmt.Sprintf("req_%016x%016x", rng.Uint64(), rng.Uint64())
					if ordered {
						batch[i].ID = fmt.Sprintf("req_%012x%020d", now.UnixMilli(), i)
					}
				}
				if err := s.AppendRequests(context.Background(), batch); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*len(batch)), "µs/line")
		})
	}
}

// A state written before migration 005 holds its live context inline: it
// is read as it is, and the first append after it writes every live row,
// whatever the caller says is unchanged.
func TestAnInlineStateIsReadAndItsRowsWrittenWhole(t *testing.T) {
	ctx := context.Background()
	s, err := Open(filepath.Join(t.TempDir(), "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := s.Create(ctx, session.Meta{Tenant: "alpha", Settings: chat.Settings{Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	live := []chat.Message{
		{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "open the page"}}},
		{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: "done"}}},
	}
	old, err := session.EncodeState(session.State{Live: live, TurnStart: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.Exec(`UPDATE sessions SET state = ? WHERE tenant = 'alpha' AND id = ?`, string(old), string(m.ID)); err != nil {
		t.Fatal(err)
	}
	snap, err := s.Load(ctx, "alpha", m.ID)
	if err != nil || !reflect.DeepEqual(snap.State.Live, live) {
		t.Fatalf("an inline state: %+v, %v", snap.State.Live, err)
	}
	next := session.State{Live: append(slices.Clone(live), chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "and now"}}}), Unchanged: 2}
	if _, err := s.Append(ctx, "alpha", m.ID, []session.Entry{{Message: &next.Live[2]}}, next); err != nil {
		t.Fatal(err)
	}
	var rows int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM live WHERE tenant = 'alpha' AND session_id = ?`, string(m.ID)).Scan(&rows); err != nil || rows != 3 {
		t.Fatalf("live rows after the first append: %d, %v; want all 3", rows, err)
	}
	if cur, err := s.LoadState(ctx, "alpha", m.ID, 0); err != nil || !reflect.DeepEqual(cur.State.Live, next.Live) {
		t.Fatalf("after the first append: %+v, %v", cur.State, err)
	}
}

// BenchmarkSaveProxied writes a proxied conversation's decisions as a
// request of a screenshot agent does when they change: 100 images decided
// (most removed, the newest kept), the oldest gone and a new one each write. It is the wait a
// streamed answer's end had for the store before the write went behind
// the answer (gateway.closeBehind).
func BenchmarkSaveProxied(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "imgctx.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	st := session.Proxied{Model: "claude-sonnet-4-6", TurnAt: 3}
	for i := range 100 {
		d := session.Decided{Msg: 4 + 2*i, Part: 1, Ref: blob.Of([]byte{byte(i)}), Keep: chat.Removed, Reason: reason.Priced}
		if i >= 90 {
			d.Keep, d.Reason, d.Cost = chat.Kept, "", 1334
		}
		st.Images = append(st.Images, d)
	}
	b.ReportAllocs()
	for b.Loop() {
		st.Messages += 2
		st.LastActivity = time.Now()
		st.Images = append(slices.Clone(st.Images[1:]), session.Decided{Msg: st.Messages - 1, Part: 1, Ref: blob.Of([]byte{byte(st.Messages)}), Keep: chat.Kept, Cost: 1334})
		if err := s.SaveProxied(context.Background(), "default", "e208cda9febccd82f9652565e3cf43f229c65c4682cbabc91cd6c20763800e71", st); err != nil {
			b.Fatal(err)
		}
	}
}
