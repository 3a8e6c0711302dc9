package engine

import (
	"errors"
	"os"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
)

// Lookup tells what a tenant's stored image is, from the metadata cache
// once it was read — and the cache never answers for another tenant: a
// ref one tenant stored is unknown to the next, looked up before or not.
func TestLookupIsTheTenants(t *testing.T) {
	png, err := os.ReadFile("../testdata/screenshot.png")
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{Images: imagestore.Verified{Store: &imagestore.Mem{}}}
	ctx := t.Context()
	in, err := e.Check(png, "image/png")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Put(ctx, "acme", in, png); err != nil {
		t.Fatal(err)
	}
	for range 2 { // read from the store, then from the cache
		got, err := e.Lookup(ctx, "acme", in.Ref)
		if err != nil || got.Ref != in.Ref || got.MediaType != "image/png" || got.Width != 1280 || got.Height != 800 {
			t.Fatalf("acme's own image: %+v, %v", got, err)
		}
		if _, err := e.Lookup(ctx, "globex", in.Ref); !errors.Is(err, ErrUnknownRef) {
			t.Fatalf("another tenant's image: %v, want ErrUnknownRef", err)
		}
	}
	if _, err := e.Lookup(ctx, "acme", blob.Of([]byte("never stored"))); !errors.Is(err, ErrUnknownRef) {
		t.Fatalf("a ref never stored: %v, want ErrUnknownRef", err)
	}
}
