package postgres

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/internal/testsvc"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sessiontest"
)

func open(t *testing.T, dsn string) *Store {
	t.Helper()
	s, err := Open(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformancePostgres(t *testing.T) {
	var dsn string
	sessiontest.Run(t, sessiontest.Harness{
		New: func(t *testing.T) session.Store {
			dsn = testsvc.Schema(t)
			return open(t, dsn)
		},
		Reopen: func(t *testing.T) session.Store { return open(t, dsn) },
	})
}

func TestMigrationsApplyOnceAcrossReplicas(t *testing.T) {
	dsn := testsvc.Schema(t)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			s, err := Open(context.Background(), dsn)
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	s := open(t, dsn)
	files, _ := fs.Glob(migrations, "migrations/*.sql")
	var n int
	if err := s.pool.QueryRow(context.Background(), `SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(files) || n < 3 {
		t.Fatalf("%d migrations recorded, %v; want each of the %d once", n, err, len(files))
	}
}

// Two replicas (two pools) appending to one session at once: every entry
// lands, numbered 1..N without a gap or a repeat.
func TestAppendsFromTwoReplicasKeepOrder(t *testing.T) {
	dsn := testsvc.Schema(t)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	meta, err := a.Create(ctx, session.Meta{Tenant: "t1", Settings: chat.Settings{Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	const each = 20
	for r, s := range []*Store{a, b} {
		wg.Go(func() {
			for i := range each {
				m := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: fmt.Sprintf("r%d-%d", r, i)}}}
				if _, err := s.Append(ctx, "t1", meta.ID, []session.Entry{{Message: &m}, {Message: &m}}, session.State{}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	snap, err := b.Load(ctx, "t1", meta.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Log) != 2*2*each {
		t.Fatalf("%d entries; want %d", len(snap.Log), 4*each)
	}
	for i, e := range snap.Log {
		if e.Seq != int64(i+1) {
			t.Fatalf("entry %d has seq %d", i, e.Seq)
		}
		// The two entries of one append stay together.
		if i%2 == 1 && e.Message.Parts[0].(chat.Text).Text != snap.Log[i-1].Message.Parts[0].(chat.Text).Text {
			t.Fatalf("entries %d and %d of one append were split", i-1, i)
		}
	}
}

// Lock holds a session against another replica until unlock, and only
// that session.
func TestLockSerialisesReplicas(t *testing.T) {
	dsn := testsvc.Schema(t)
	a, b := open(t, dsn), open(t, dsn)
	ctx := context.Background()
	unlock, err := a.Lock(ctx, "t1", "s1")
	if err != nil {
		t.Fatal(err)
	}
	other, err := b.Lock(ctx, "t1", "s2")
	if err != nil {
		t.Fatal(err)
	}
	other()
	got := make(chan struct{})
	go func() {
		u, err := b.Lock(ctx, "t1", "s1")
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		close(got)
		u()
	}()
	select {
	case <-got:
		t.Fatal("the second replica took a lock the first holds")
	default:
	}
	// A waiter whose context ends gives up with the context's error.
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.Lock(short, "t1", "s1"); err == nil {
		t.Fatal("a cancelled Lock succeeded while the lock was held")
	}
	unlock()
	<-got
}

func TestOpenErrorsHideThePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://imgctx:s3cret@127.0.0.1:1/imgctx?connect_timeout=1",
		"host=127.0.0.1 port=1 user=imgctx password=s3cret connect_timeout=1",
		"postgres://imgctx:s3cret@[::1/x",
	} {
		_, err := Open(context.Background(), dsn)
		if err == nil {
			t.Fatalf("%q: opened", dsn)
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Fatalf("the error carries the password: %v", err)
		}
	}
}

// Proxied decisions are written without waiting for the WAL flush (as the
// SQLite store's synchronous=NORMAL); sessions and their log keep the
// server's full durability.
func TestProxiedWritesSkipTheWALWait(t *testing.T) {
	s := open(t, testsvc.Schema(t))
	ctx := context.Background()
	var fast, full string
	if err := s.proxied.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&fast); err != nil {
		t.Fatal(err)
	}
	if err := s.pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&full); err != nil {
		t.Fatal(err)
	}
	if fast != "off" || full != "on" {
		t.Fatalf("synchronous_commit: proxied %q, sessions %q; want off and on", fast, full)
	}
}
