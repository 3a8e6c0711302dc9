package engine

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire/openai"
)

// Decoding across requests is bounded by the memory decodes hold: a decode
// waits while the bytes in flight would pass the bound, goes on once
// others release, gives up when its request ends, and is refused with
// ErrBusy once it waited the slots' wait.
func TestMemorySlots(t *testing.T) {
	m := &memorySlots{size: 10, wait: time.Hour, byTenant: map[string]int64{}}
	if err := m.Acquire(context.Background(), "a", 4); err != nil {
		t.Fatal(err)
	}
	if err := m.Acquire(context.Background(), "b", 4); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() { got <- m.Acquire(context.Background(), "c", 5) }()
	select {
	case err := <-got:
		t.Fatalf("acquired past the bound: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	m.Release("a", 4)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := m.Acquire(ctx, "a", 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("acquired 2 beside 9 of 10: %v", err)
	}
	m.wait = 50 * time.Millisecond
	if err := m.Acquire(context.Background(), "a", 2); !errors.Is(err, ErrBusy) {
		t.Fatalf("a decode that waited its wait: %v; want ErrBusy", err)
	}
	m.Release("b", 4)
	m.Release("c", 5)
	if err := m.Acquire(context.Background(), "a", 10); err != nil || m.used != 10 || len(m.byTenant) != 1 {
		t.Fatalf("the whole bound free: %v, %d used by %v", err, m.used, m.byTenant)
	}
}

// Fair between tenants: a tenant holding some may hold half the bound at
// most, so another's decode finds room without waiting for the first
// tenant's queue; a tenant holding none may take any free room (an image
// larger than half the bound still decodes).
func TestMemorySlotsAreFairBetweenTenants(t *testing.T) {
	m := &memorySlots{size: 10, wait: 50 * time.Millisecond, byTenant: map[string]int64{}}
	if err := m.Acquire(context.Background(), "a", 4); err != nil {
		t.Fatal(err)
	}
	if err := m.Acquire(context.Background(), "a", 2); !errors.Is(err, ErrBusy) {
		t.Fatalf("tenant a past half the bound: %v; want it to wait, then ErrBusy", err)
	}
	if err := m.Acquire(context.Background(), "b", 5); err != nil {
		t.Fatalf("tenant b beside a's 4: %v", err)
	}
	m.Release("a", 4)
	m.Release("b", 5)
	if err := m.Acquire(context.Background(), "a", 8); err != nil {
		t.Fatalf("one image over half the bound, nothing held: %v", err)
	}
}

// A proxied request whose images must be shrunk waits for decode memory;
// when none frees up within the wait it fails with ErrBusy (the gateway
// answers 503 with Retry-After) instead of losing its image, and goes
// through once the memory is free.
func TestAProxiedRequestWithoutDecodeMemoryIsBusy(t *testing.T) {
	edge := tokens.Profile{Name: "edge", Match: []string{"edge-*"}, Family: "openai", ContextWindow: 100_000, Vision: true,
		Tokenizer: "chars4", Image: tokens.ImageRule{Rule: "openai_tile", BaseTokens: 85, TileTokens: 170}, Limits: tokens.Limits{MaxEdge: 400}}
	table, err := tokens.Default().With(edge)
	if err != nil {
		t.Fatal(err)
	}
	client := okUpstream(t, nil)
	e := &Engine{Config: Config{ShrinkWait: 50 * time.Millisecond}, Images: imagestore.Verified{Store: &imagestore.Mem{}}, Sessions: &session.Mem{},
		Profiles: table, Upstream: client, Shrinker: &media.Shrinker{}}
	e.once.Do(e.init)
	body := []byte(`{"model":"edge-1","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"` + screenshot(800, 600, 3) + `"}}]}]}`)
	call := func() error {
		p, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
			Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Keep: true})
		if err == nil {
			p.Close(t.Context())
		}
		return err
	}
	if err := e.decodeSlots.Acquire(t.Context(), "b", e.decodeSlots.size); err != nil {
		t.Fatal(err)
	}
	if err := call(); !errors.Is(err, ErrBusy) {
		t.Fatalf("no decode memory: %v; want ErrBusy", err)
	}
	e.decodeSlots.Release("b", e.decodeSlots.size)
	if err := call(); err != nil {
		t.Fatalf("memory free: %v", err)
	}
}
