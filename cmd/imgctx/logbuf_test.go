package main

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/internal/config"
)

// lockedBuffer is a bytes.Buffer the ticker and the test may share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func bufferedLogger(every time.Duration) (*slog.Logger, *bufferedLog, *lockedBuffer) {
	dst := &lockedBuffer{}
	out := newBufferedLog(dst, every)
	return slog.New(flushing{newLogger(out, config.Log{Level: "info", Format: "text"}).Handler(), out}), out, dst
}

// Info lines wait for the tick; a warning writes itself and every line
// before it at once, in order; Close writes the rest.
func TestAWarningWritesTheLogAtOnce(t *testing.T) {
	log, out, dst := bufferedLogger(time.Hour)
	log.Info("first")
	log.With("k", "v").Info("second")
	if got := dst.String(); got != "" {
		t.Fatalf("info lines written before the tick: %q", got)
	}
	log.With("k", "v").Warn("careful")
	got := dst.String()
	i, j, k := strings.Index(got, "msg=first"), strings.Index(got, "msg=second k=v"), strings.Index(got, "msg=careful k=v")
	if i < 0 || j < i || k < j {
		t.Fatalf("after a warning the log holds %q: want first, second and the warning, in order", got)
	}
	log.Info("last")
	if strings.Contains(dst.String(), "msg=last") {
		t.Fatal("an info line after the warning was written before the tick")
	}
	out.Close()
	if !strings.Contains(dst.String(), "msg=last") {
		t.Fatalf("Close did not write what was left: %q", dst.String())
	}
}

// The tick writes what waits, with no warning and no Close.
func TestTheLogIsWrittenOnItsTick(t *testing.T) {
	log, out, dst := bufferedLogger(10 * time.Millisecond)
	defer out.Close()
	log.Info("waiting")
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(dst.String(), "msg=waiting"); {
		if time.Now().After(deadline) {
			t.Fatal("the line was never written by the tick")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Lines from many goroutines arrive whole, each once.
func TestConcurrentLogLinesArriveWhole(t *testing.T) {
	log, out, dst := bufferedLogger(time.Millisecond)
	const writers, lines = 8, 300
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range lines {
				log.Info("line", "writer", w, "i", i, "pad", strings.Repeat("x", 200))
			}
		})
	}
	wg.Wait()
	out.Close()
	seen := map[string]bool{}
	for _, l := range strings.Split(strings.TrimSuffix(dst.String(), "\n"), "\n") {
		var w, i int
		_, fields, _ := strings.Cut(l, " writer=")
		if _, err := fmt.Sscanf(fields, "%d i=%d", &w, &i); err != nil || !strings.HasSuffix(l, strings.Repeat("x", 200)) {
			t.Fatalf("a line arrived broken: %q", l)
		}
		key := fmt.Sprint(w, " ", i)
		if seen[key] {
			t.Fatalf("line %s arrived twice", key)
		}
		seen[key] = true
	}
	if len(seen) != writers*lines {
		t.Fatalf("%d lines arrived, want %d", len(seen), writers*lines)
	}
}
