package imagestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	. "github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/imagestore/storetest"
)

var errCrash = errors.New("simulated crash")

func fsHarness(wrap func(*FS) Store) storetest.Harness {
	var dir string
	var last *FS
	return storetest.Harness{
		New: func(t *testing.T, now func() time.Time) Store {
			dir = t.TempDir()
			last = &FS{Root: dir, Now: now}
			return Verified{wrap(last)}
		},
		Reopen: func(t *testing.T) Store { return Verified{wrap(&FS{Root: dir})} },
		Crash: func(Store) func() {
			SetBeforeRename(last, func() error { return errCrash })
			return func() { SetBeforeRename(last, nil) }
		},
	}
}

func testKey(b byte) []byte {
	k := make([]byte, 32)
	for i := range k {
		k[i] = b + byte(i)
	}
	return k
}

func TestConformanceFS(t *testing.T) {
	storetest.Run(t, fsHarness(func(f *FS) Store { return f }))
}

func TestConformanceEncryptedFS(t *testing.T) {
	storetest.Run(t, fsHarness(func(f *FS) Store {
		e, err := NewEncrypted(f, Key{Version: 1, Master: testKey(1)})
		if err != nil {
			t.Fatal(err)
		}
		return e
	}))
}

func TestConformanceMem(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, now func() time.Time) Store { return Verified{&Mem{Now: now}} },
	})
}

func TestConformanceEncryptedMem(t *testing.T) {
	storetest.Run(t, storetest.Harness{
		New: func(t *testing.T, now func() time.Time) Store {
			e, err := NewEncrypted(&Mem{Now: now}, Key{Version: 7, Master: testKey(9)})
			if err != nil {
				t.Fatal(err)
			}
			return Verified{e}
		},
	})
}

// racingStore lets something happen between GC's scan and its deletions.
type racingStore struct {
	Store
	afterList func()
}

func (r racingStore) List(ctx context.Context, tenant string, fn func(Info) error) error {
	err := r.Store.List(ctx, tenant, fn)
	r.afterList()
	return err
}

// GC deletes only what is still old when it gets to it: an image touched
// after the scan stays, one deleted meanwhile is passed over without an
// error, and only the rest is removed and counted.
func TestGCKeepsWhatChangedSinceItsScan(t *testing.T) {
	now := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	mem := &Mem{Now: func() time.Time { return now }}
	ctx := context.Background()
	var refs []blob.Ref
	for _, b := range []string{"touched since", "deleted since", "still old"} {
		ref := blob.Of([]byte(b))
		if err := mem.Put(ctx, "acme", ref, []byte(b)); err != nil {
			t.Fatal(err)
		}
		refs = append(refs, ref)
	}
	s := racingStore{Store: mem, afterList: func() {
		now = now.Add(2 * time.Hour)
		mem.Touch(ctx, "acme", refs[0])
		mem.Delete(ctx, "acme", refs[1])
	}}
	st, err := GC(ctx, s, "acme", now.Add(time.Hour), nil, nil)
	if err != nil || st.Scanned != 3 || st.Removed != 1 || st.Freed != int64(len("still old")) {
		t.Fatalf("GC: %+v, %v; want 3 scanned, 1 removed", st, err)
	}
	if _, err := mem.Stat(ctx, "acme", refs[0]); err != nil {
		t.Fatalf("the image touched after the scan was deleted: %v", err)
	}
	if _, err := mem.Stat(ctx, "acme", refs[2]); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the old image stayed: %v", err)
	}
}
