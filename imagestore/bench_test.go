package imagestore_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync/atomic"
	"testing"

	. "github.com/imgctx/imgctx/imagestore"
)

func distinctImages(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(j*7 + i)
		}
		b[0], b[1] = byte(i), byte(i>>8)
		out[i] = b
	}
	return out
}

// BenchmarkPut1MB measures a verified, durable put of distinct 1 MB images
// (hash, write, fsync, read back, rename, directory fsync), as
// imagestore.Put does it. The baseline is SHA-256 alone over the same bytes,
// the floor any content-addressed store pays.
func BenchmarkPut1MB(b *testing.B) {
	ctx := context.Background()
	imgs := distinctImages(64, 1<<20)
	b.Run("baseline=sha256", func(b *testing.B) {
		b.SetBytes(1 << 20)
		for i := 0; b.Loop(); i++ {
			sha256.Sum256(imgs[i%len(imgs)])
		}
	})
	stacks := []struct {
		name string
		mk   func(dir string) Store
	}{
		{"fs", func(dir string) Store { f, _ := NewFS(dir); return Verified{f} }},
		{"fs+encrypted", func(dir string) Store { s, _, _ := Open(dir, testKey(1)); return s }},
		{"fs-nosync", func(dir string) Store { f, _ := NewFS(dir); f.NoSync = true; return Verified{f} }},
	}
	for _, st := range stacks {
		b.Run(st.name, func(b *testing.B) {
			s := st.mk(b.TempDir())
			b.SetBytes(1 << 20)
			for i := 0; b.Loop(); i++ {
				data := imgs[i%len(imgs)]
				binary.LittleEndian.PutUint64(data[8:], uint64(i)) // every put a new image
				if _, err := Put(ctx, s, "t", data); err != nil {
					b.Fatal(err)
				}
			}
		})
		// Puts from many requests at once, as a gateway sees them: the
		// journal commits their fsyncs together.
		b.Run(st.name+"-parallel8", func(b *testing.B) {
			s := st.mk(b.TempDir())
			b.SetBytes(1 << 20)
			b.SetParallelism(4) // 8 goroutines on 2 cores
			var seq atomic.Uint64
			b.RunParallel(func(pb *testing.PB) {
				data := distinctImages(1, 1<<20)[0]
				for pb.Next() {
					binary.LittleEndian.PutUint64(data[8:], seq.Add(1))
					if _, err := Put(ctx, s, "t", data); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

func BenchmarkGet1MB(b *testing.B) {
	ctx := context.Background()
	f, _ := NewFS(b.TempDir())
	s := Verified{f}
	data := distinctImages(1, 1<<20)[0]
	ref, _ := Put(ctx, s, "t", data)
	b.SetBytes(1 << 20)
	for b.Loop() {
		if _, err := s.Get(ctx, "t", ref); err != nil {
			b.Fatal(err)
		}
	}
}
