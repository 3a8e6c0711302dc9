package engine

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
)

// BenchmarkExpandRef: a 1 MB image expanded to base64 for the upstream,
// cold (read from the verified store, encoded) and hot (from the LRU).
func BenchmarkExpandRef(b *testing.B) {
	ctx := context.Background()
	fsys, _ := imagestore.NewFS(b.TempDir())
	store := imagestore.Verified{Store: fsys}
	data := make([]byte, 1<<20)
	rand.Read(data)
	ref := blob.Of(data)
	imagestore.PutComputed(ctx, store, "t", ref, data)
	b.Run("cold", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for b.Loop() {
			e := &Engine{Images: store}
			e.init()
			if _, err := e.Base64(ctx, "t", ref); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("hot", func(b *testing.B) {
		e := &Engine{Images: store}
		e.init()
		e.Base64(ctx, "t", ref)
		b.SetBytes(1 << 20)
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Base64(ctx, "t", ref); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline=encode-only", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for b.Loop() {
			base64.StdEncoding.EncodeToString(data)
		}
	})
}
