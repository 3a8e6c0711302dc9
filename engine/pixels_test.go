package engine

import (
	"context"
	"testing"
	"time"
)

// Decoding across requests is bounded: a decode waits while the pixels in
// flight would pass the bound, goes on once others release, and gives up
// when its request ends.
func TestPixelSlots(t *testing.T) {
	p := &pixelSlots{size: 10}
	if err := p.Acquire(context.Background(), 8); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- p.Acquire(context.Background(), 5) }()
	select {
	case err := <-got:
		t.Fatalf("acquired past the bound: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	p.Release(8)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Acquire(ctx, 6); err == nil {
		t.Fatal("acquired 6 beside 5 of 10")
	}
	p.Release(5)
	if err := p.Acquire(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
}
