package imagestore_test

import (
	"errors"
	"testing"
	"time"

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
