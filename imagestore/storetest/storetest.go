// Package storetest is the conformance suite for imagestore.Store
// implementations. Every backend and decorator stack runs it, as
// slogtest does for slog handlers.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
)

// Harness tells the suite how to build the store under test.
type Harness struct {
	// New returns an empty store stack as callers use it (Verified
	// outermost) whose clock is now.
	New func(t *testing.T, now func() time.Time) imagestore.Store
	// Reopen, when set, returns a new instance over the same storage as the
	// last store New returned, as a process restart would.
	Reopen func(t *testing.T) imagestore.Store
	// Crash, when set, makes s's puts fail between writing and committing, as
	// a crash at that moment would; undo restores normal puts.
	Crash func(s imagestore.Store) (undo func())
}

// clock is a settable time source for the store under test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// image returns n deterministic bytes that differ by seed.
func image(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31) ^ seed
	}
	return b
}

// Run runs the whole suite.
func Run(t *testing.T, h Harness) {
	ctx := context.Background()
	const ten, other = "alpha", "beta"
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	newStore := func(t *testing.T) (imagestore.Store, *clock) {
		c := &clock{t: start}
		return h.New(t, c.now), c
	}
	mustPut := func(t *testing.T, s imagestore.Store, tenant string, data []byte) blob.Ref {
		t.Helper()
		ref, err := put(ctx, s, tenant, data)
		if err != nil {
			t.Fatalf("put: %v", err)
		}
		return ref
	}
	count := func(t *testing.T, s imagestore.Store, tenant string) int {
		t.Helper()
		n := 0
		if err := s.List(ctx, tenant, func(imagestore.Info) error { n++; return nil }); err != nil {
			t.Fatalf("list: %v", err)
		}
		return n
	}

	t.Run("put then get returns the same bytes", func(t *testing.T) {
		s, _ := newStore(t)
		for _, n := range []int{0, 1, 1000, 1 << 20} {
			data := image(byte(n), n)
			ref := mustPut(t, s, ten, data)
			got, err := s.Get(ctx, ten, ref)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("size %d: got %d bytes, %v; want the same bytes", n, len(got), err)
			}
			in, err := s.Stat(ctx, ten, ref)
			if err != nil || in.Size != int64(n) || in.Ref != ref {
				t.Fatalf("size %d: stat %+v, %v", n, in, err)
			}
		}
	})

	t.Run("missing refs are not found", func(t *testing.T) {
		s, _ := newStore(t)
		ref := blob.Of([]byte("never stored"))
		if _, err := s.Get(ctx, ten, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("get: got %v; want ErrNotFound", err)
		}
		if _, err := s.Stat(ctx, ten, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("stat: got %v; want ErrNotFound", err)
		}
		if err := s.Touch(ctx, ten, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("touch: got %v; want ErrNotFound", err)
		}
		if err := s.Delete(ctx, ten, ref); err != nil {
			t.Fatalf("delete of a missing ref: %v", err)
		}
		if n := count(t, s, ten); n != 0 {
			t.Fatalf("empty store lists %d blobs", n)
		}
	})

	t.Run("bytes that do not match the ref are refused and not stored", func(t *testing.T) {
		s, _ := newStore(t)
		ref := blob.Of([]byte("the real image"))
		err := s.Put(ctx, ten, ref, []byte("something else"))
		if !errors.Is(err, imagestore.ErrRefMismatch) {
			t.Fatalf("got %v; want ErrRefMismatch", err)
		}
		if _, err := s.Stat(ctx, ten, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("a refused put left something: %v", err)
		}
	})

	t.Run("bad arguments are refused", func(t *testing.T) {
		s, _ := newStore(t)
		data := image(1, 10)
		for _, bad := range []string{"", "../x", ".hidden", "a/b", "über", string(make([]byte, 65))} {
			if _, err := put(ctx, s, bad, data); !errors.Is(err, imagestore.ErrInvalidTenant) {
				t.Fatalf("tenant %q: got %v; want ErrInvalidTenant", bad, err)
			}
		}
		if _, err := s.Get(ctx, ten, blob.Ref{}); !errors.Is(err, imagestore.ErrInvalidRef) {
			t.Fatalf("zero ref: got %v; want ErrInvalidRef", err)
		}
	})

	t.Run("a second put stores once and refreshes the date", func(t *testing.T) {
		s, c := newStore(t)
		data := image(2, 5000)
		ref := mustPut(t, s, ten, data)
		first, _ := s.Stat(ctx, ten, ref)
		c.advance(time.Hour)
		mustPut(t, s, ten, data)
		second, _ := s.Stat(ctx, ten, ref)
		if n := count(t, s, ten); n != 1 {
			t.Fatalf("two puts of one image list %d blobs", n)
		}
		if !second.ModTime.After(first.ModTime) {
			t.Fatalf("date not refreshed: %v then %v", first.ModTime, second.ModTime)
		}
	})

	t.Run("touch refreshes the date", func(t *testing.T) {
		s, c := newStore(t)
		ref := mustPut(t, s, ten, image(3, 100))
		before, _ := s.Stat(ctx, ten, ref)
		c.advance(48 * time.Hour)
		if err := s.Touch(ctx, ten, ref); err != nil {
			t.Fatal(err)
		}
		after, _ := s.Stat(ctx, ten, ref)
		if got := after.ModTime.Sub(before.ModTime); got < 47*time.Hour {
			t.Fatalf("touch moved the date by %v; want about 48h", got)
		}
	})

	t.Run("delete removes", func(t *testing.T) {
		s, _ := newStore(t)
		ref := mustPut(t, s, ten, image(4, 100))
		keep := mustPut(t, s, ten, image(5, 100))
		if err := s.Delete(ctx, ten, ref); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, ten, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("deleted blob still readable: %v", err)
		}
		if _, err := s.Get(ctx, ten, keep); err != nil {
			t.Fatalf("delete removed another blob: %v", err)
		}
	})

	t.Run("tenants are isolated", func(t *testing.T) {
		s, _ := newStore(t)
		data := image(6, 300)
		ref := mustPut(t, s, ten, data)
		if _, err := s.Get(ctx, other, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("other tenant get: got %v; want ErrNotFound", err)
		}
		if _, err := s.Stat(ctx, other, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("other tenant stat: got %v; want ErrNotFound", err)
		}
		if err := s.Touch(ctx, other, ref); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("other tenant touch: got %v; want ErrNotFound", err)
		}
		if n := count(t, s, other); n != 0 {
			t.Fatalf("other tenant lists %d blobs", n)
		}
		if err := s.Delete(ctx, other, ref); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, ten, ref); err != nil {
			t.Fatalf("another tenant's delete removed the blob: %v", err)
		}
	})

	t.Run("concurrent puts of the same image", func(t *testing.T) {
		s, _ := newStore(t)
		data := image(7, 256<<10)
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for range 16 {
			wg.Go(func() {
				_, err := put(ctx, s, ten, data)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("concurrent put: %v", err)
			}
		}
		got, err := s.Get(ctx, ten, blob.Of(data))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("after concurrent puts: %v", err)
		}
		if n := count(t, s, ten); n != 1 {
			t.Fatalf("concurrent puts of one image list %d blobs", n)
		}
	})

	t.Run("concurrent puts and gets of different images", func(t *testing.T) {
		s, _ := newStore(t)
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for i := range 32 {
			wg.Go(func() {
				data := image(byte(i), 1000+i)
				ref, err := put(ctx, s, ten, data)
				if err == nil {
					var got []byte
					got, err = s.Get(ctx, ten, ref)
					if err == nil && !bytes.Equal(got, data) {
						err = fmt.Errorf("image %d: wrong bytes", i)
					}
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		if n := count(t, s, ten); n != 32 {
			t.Fatalf("listed %d blobs; want 32", n)
		}
	})

	t.Run("returned and given slices are not retained", func(t *testing.T) {
		s, _ := newStore(t)
		data := image(8, 64)
		orig := bytes.Clone(data)
		ref := mustPut(t, s, ten, data)
		data[0] ^= 0xff
		got, _ := s.Get(ctx, ten, ref)
		got[1] ^= 0xff
		again, err := s.Get(ctx, ten, ref)
		if err != nil || !bytes.Equal(again, orig) {
			t.Fatalf("store shares memory with its callers: %v", err)
		}
	})

	t.Run("list is in ref order and stops on error", func(t *testing.T) {
		s, _ := newStore(t)
		for i := range 5 {
			mustPut(t, s, ten, image(byte(10+i), 50))
		}
		var prev string
		n := 0
		stop := errors.New("stop")
		err := s.List(ctx, ten, func(in imagestore.Info) error {
			if in.Ref.String() <= prev {
				t.Fatalf("list out of order: %s after %s", in.Ref, prev)
			}
			prev = in.Ref.String()
			n++
			if n == 3 {
				return stop
			}
			return nil
		})
		if !errors.Is(err, stop) || n != 3 {
			t.Fatalf("list did not stop: n=%d err=%v", n, err)
		}
	})

	t.Run("gc removes what was not touched since the cutoff", func(t *testing.T) {
		s, c := newStore(t)
		old := mustPut(t, s, ten, image(20, 100))
		fresh := mustPut(t, s, ten, image(21, 100))
		inUse := mustPut(t, s, ten, image(22, 100))
		c.advance(10 * 24 * time.Hour)
		if err := s.Touch(ctx, ten, fresh); err != nil {
			t.Fatal(err)
		}
		calls := 0
		st, err := imagestore.GC(ctx, s, ten, c.now().Add(-24*time.Hour), map[blob.Ref]bool{inUse: true}, func(imagestore.GCStats) { calls++ })
		if err != nil {
			t.Fatal(err)
		}
		if st.Removed != 1 || st.Scanned != 3 || st.Kept != 1 || st.Freed != 100 || calls != 1 {
			t.Fatalf("gc stats %+v, %d progress calls; want 1 of 3 removed, 1 kept in use, 100 bytes", st, calls)
		}
		if _, err := s.Get(ctx, ten, inUse); err != nil {
			t.Fatalf("a blob still referenced was removed by gc: %v", err)
		}
		if _, err := s.Get(ctx, ten, old); !errors.Is(err, imagestore.ErrNotFound) {
			t.Fatalf("old blob survived gc: %v", err)
		}
		if _, err := s.Get(ctx, ten, fresh); err != nil {
			t.Fatalf("fresh blob removed by gc: %v", err)
		}
	})

	if h.Reopen != nil {
		t.Run("blobs survive a restart", func(t *testing.T) {
			s, _ := newStore(t)
			data := image(30, 4096)
			ref := mustPut(t, s, ten, data)
			got, err := h.Reopen(t).Get(ctx, ten, ref)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("after reopen: %v", err)
			}
		})
	}

	if h.Crash != nil {
		t.Run("a crash between write and rename leaves nothing readable", func(t *testing.T) {
			s, _ := newStore(t)
			data := image(40, 8192)
			undo := h.Crash(s)
			ref, err := put(ctx, s, ten, data)
			undo()
			if err == nil {
				t.Fatal("put succeeded through a simulated crash")
			}
			stores := []imagestore.Store{s}
			if h.Reopen != nil {
				stores = append(stores, h.Reopen(t))
			}
			for _, st := range stores {
				if _, err := st.Get(ctx, ten, ref); !errors.Is(err, imagestore.ErrNotFound) {
					t.Fatalf("partial blob readable after crash: %v", err)
				}
				if n := count(t, st, ten); n != 0 {
					t.Fatalf("crash left %d listed blobs", n)
				}
			}
			if _, err := put(ctx, s, ten, data); err != nil {
				t.Fatalf("put after recovery: %v", err)
			}
		})
	}
}

// put stores data under its ref, as the engine does.
func put(ctx context.Context, s imagestore.Store, tenant string, data []byte) (blob.Ref, error) {
	ref := blob.Of(data)
	return ref, imagestore.PutComputed(ctx, s, tenant, ref, data)
}
