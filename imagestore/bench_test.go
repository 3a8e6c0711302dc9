package imagestore_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"sync/atomic"
	"testing"

	"github.com/imgctx/imgctx/blob"
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

// BenchmarkPut1MB measures a verified put of distinct 1 MB images as
// imagestore.Put does it (hash, write, fsync, read back, rename, directory
// fsync). The baseline is SHA-256 alone over the same bytes, the floor any
// content-addressed store pays.
//
// Each blob is deleted 32 puts later, outside the timer, so the dirty page
// cache stays bounded: otherwise the kernel throttles writers once hundreds
// of MB are waiting for this machine's slow disk, and the figure measures
// the disk, not the store. The "fs" rows still fsync and so include the
// disk; "nosync" rows are the page-cache cost of the store itself.
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
		{"fs+encrypted", func(dir string) Store { f, _ := NewFS(dir); s, _ := Stack(f, testKey(1)); return s }},
		{"fs-nosync", func(dir string) Store { f, _ := NewFS(dir); f.NoSync = true; return Verified{f} }},
	}
	for _, st := range stacks {
		b.Run(st.name, func(b *testing.B) {
			s := st.mk(b.TempDir())
			var window [32]blob.Ref
			b.SetBytes(1 << 20)
			for i := 0; b.Loop(); i++ {
				data := imgs[i%len(imgs)]
				binary.LittleEndian.PutUint64(data[8:], uint64(i)) // every put a new image
				ref, err := Put(ctx, s, "t", data)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if old := window[i%len(window)]; old.Valid() {
					s.Delete(ctx, "t", old)
				}
				window[i%len(window)] = ref
				b.StartTimer()
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
				var window [4]blob.Ref
				for i := 0; pb.Next(); i++ {
					binary.LittleEndian.PutUint64(data[8:], seq.Add(1))
					ref, err := Put(ctx, s, "t", data)
					if err != nil {
						b.Error(err)
						return
					}
					// Bounded dirty set, as above (inside the timer: parallel
					// benchmarks cannot stop it; a delete is a small unlink).
					if old := window[i%len(window)]; old.Valid() {
						s.Delete(ctx, "t", old)
					}
					window[i%len(window)] = ref
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
