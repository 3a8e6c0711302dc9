package engine

import (
	"context"
	"encoding/base64"
	"sync/atomic"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
)

// readCounter counts the store's reads, to see what the base64 cache
// answered itself.
type readCounter struct {
	imagestore.Store
	reads atomic.Int64
}

func (s *readCounter) Get(ctx context.Context, tenant string, ref blob.Ref) ([]byte, error) {
	s.reads.Add(1)
	return s.Store.Get(ctx, tenant, ref)
}

// The base64 cache holds at most Base64CacheBytes of encodings: past it
// the least recently used leave (a read moves one to the front), an
// encoding larger than the whole cache is never held (nor pushes the
// others out), and whatever the cache holds, every answer is the image's
// base64.
func TestBase64CacheKeepsTheRecentWithinItsBound(t *testing.T) {
	ctx := t.Context()
	store := &readCounter{Store: &imagestore.Mem{}}
	images := map[string][]byte{"a": make([]byte, 300), "b": make([]byte, 300), "c": make([]byte, 300), "big": make([]byte, 900)}
	refs := map[string]blob.Ref{}
	for name, data := range images {
		copy(data, name) // distinct contents, distinct refs
		refs[name] = blob.Of(data)
		if err := store.Put(ctx, "t", refs[name], data); err != nil {
			t.Fatal(err)
		}
	}
	e := &Engine{Images: store, Config: Config{Base64CacheBytes: 2 * 400}} // two 300-byte images: 400 characters of base64 each
	e.init()
	get := func(name string) {
		t.Helper()
		s, err := e.Base64(ctx, "t", refs[name])
		if err != nil || s != base64.StdEncoding.EncodeToString(images[name]) {
			t.Fatalf("%s: %.20q, %v", name, s, err)
		}
	}
	read := func(names ...string) int64 {
		t.Helper()
		before := store.reads.Load()
		for _, n := range names {
			get(n)
		}
		return store.reads.Load() - before
	}
	if n := read("a", "b", "a"); n != 2 {
		t.Fatalf("a, b, a read the store %d times; want 2", n)
	}
	// c comes in: b was used less recently than a, so b leaves.
	if n := read("c", "a"); n != 1 {
		t.Fatalf("c, then a, read the store %d times; want 1 (a stays)", n)
	}
	if n := read("b"); n != 1 {
		t.Fatal("b stayed in a cache of two past a third image")
	}
	// b came back: c, the least recent, left; a did not.
	if n := read("a", "c"); n != 1 {
		t.Fatalf("a, then c, read the store %d times; want 1 (c only)", n)
	}
	if n := read("big", "big"); n != 2 {
		t.Fatalf("an encoding larger than the cache read the store %d times in two; want 2 (never held)", n)
	}
	if n := read("a", "c"); n != 0 {
		t.Fatal("an encoding larger than the cache pushed out what it held")
	}
	if e.b64.size > e.b64.max || e.b64.order.Len() != len(e.b64.m) {
		t.Fatalf("cache at %d bytes of %d, %d in order, %d in the map", e.b64.size, e.b64.max, e.b64.order.Len(), len(e.b64.m))
	}
}
