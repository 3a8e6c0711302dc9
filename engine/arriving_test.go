package engine

import (
	"bytes"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/openai"
	"pgregory.net/rapid"
)

// However a body arrives — in reads of any size — what Arriving counts as
// known is exactly the bytes it shares with the previous request: never a
// byte that differs, and all of them when every read was compared in order.
// A read out of order stops the count where it was.
func TestArrivingKnowsExactlyWhatMatches(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		prev := rapid.SliceOfN(rapid.ByteRange('a', 'c'), 0, 300).Draw(t, "prev")
		keep := rapid.IntRange(0, len(prev)).Draw(t, "keep")
		body := append(append([]byte(nil), prev[:keep]...), rapid.SliceOfN(rapid.ByteRange('a', 'c'), 0, 300).Draw(t, "rest")...)
		a := &Arriving{prev: resumed{res: &wire.Resume{Body: prev}}, done: func() {}}
		skip := rapid.Bool().Draw(t, "skip a read")
		skipped := -1 // where the skipped read began
		for off := 0; off < len(body); {
			n := rapid.IntRange(1, len(body)-off).Draw(t, "read")
			if skip && off > 0 && skipped < 0 {
				skipped = off
			} else {
				a.Compare(off, body[off:off+n])
			}
			off += n
		}
		full := wire.CommonPrefix(prev, body)
		switch {
		case a.known > full:
			t.Fatalf("known %d bytes, but they share only %d", a.known, full)
		case skipped < 0 && a.known != full:
			t.Fatalf("known %d of %d shared bytes", a.known, full)
		case skipped >= 0 && a.known > skipped:
			t.Fatalf("known %d bytes past a read skipped at %d", a.known, skipped)
		}
	})
}

// A body compared as it arrived is forwarded exactly as sent, and the
// scan takes over from the previous request only the messages before the
// first byte that differs: a history edited in its middle (same length,
// same first kilobytes) resumes up to the edit. Proxy releases what it is
// handed once, whether the body names the same conversation or not, and
// on a refusal too.
func TestProxyResumesFromWhatArrived(t *testing.T) {
	var mu sync.Mutex
	var got [][]byte
	client := okUpstream(t, func(b []byte) {
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
	})
	e := proxyEngine(client)
	history := func(rounds int, edit string) []byte {
		msgs := []string{`{"role":"system","content":"you write code` + strings.Repeat(" carefully", 500) + `"}`}
		for k := range rounds {
			text := fmt.Sprintf("step %03d", k)
			if k == 20 && edit != "" {
				text = edit
			}
			msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"%s"}`, text), fmt.Sprintf(`{"role":"assistant","content":"done %03d"}`, k))
		}
		return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(msgs, ",") + `]}`)
	}
	released := 0
	send := func(body []byte, chunk int) ProxyCounts {
		t.Helper()
		head := body[:min(len(body), ArrivingHead)]
		a := e.Arriving("a", openai.Dialect, http.Header{}, head)
		if a != nil {
			done := a.done
			a.done = func() { released++; done() }
			for off := len(head); off < len(body); off += chunk {
				a.Compare(off, body[off:min(off+chunk, len(body))])
			}
		}
		p, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
			Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Arriving: a})
		if err != nil {
			t.Fatal(err)
		}
		p.Close(t.Context())
		if last := got[len(got)-1]; !bytes.Equal(last, body) {
			t.Fatalf("the upstream got %d bytes, not the %d sent", len(last), len(body))
		}
		return p.Counts
	}
	first := history(40, "")
	if c := send(first, 1000); c.Resumed != 0 {
		t.Fatalf("the first request resumed %d messages", c.Resumed)
	}
	edited := history(40, "step 999") // same length, message 41 differs
	if len(edited) != len(first) {
		t.Fatal("the edit changed the length")
	}
	if c := send(edited, 777); c.Resumed != 41 {
		t.Fatalf("the edited history resumed %d messages, want the 41 before the edit", c.Resumed)
	}
	if c := send(history(45, "step 999"), 4096); c.Resumed != 81 {
		t.Fatalf("the grown history resumed %d messages, want all 81 of the one before", c.Resumed)
	}
	if released != 2 {
		t.Fatalf("released %d times over two arrivals, want 2", released)
	}
	// Compared with another conversation's request: released, and the
	// scan finds its own.
	other := e.Arriving("a", openai.Dialect, http.Header{}, history(45, "step 999")[:ArrivingHead])
	other.done = func() { released++ }
	body := history(46, "step 999")
	body = append([]byte(`{"model":"gpt-4o" , `), body[len(`{"model":"gpt-4o",`):]...) // other first bytes
	if _, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: body, Header: http.Header{},
		Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Arriving: other}); err != nil {
		t.Fatal(err)
	}
	// A refusal releases it too.
	refused := e.Arriving("a", openai.Dialect, http.Header{}, history(45, "step 999")[:ArrivingHead])
	refused.done = func() { released++ }
	if _, err := e.Proxy(t.Context(), ProxyCall{Tenant: "a", Wire: openai.Dialect, Body: []byte(`{"model":"gpt-4o","messages":[`), Header: http.Header{},
		Upstream: upstream.Request{Path: "/v1/chat/completions"}, Routes: []*Route{{Name: "up", Client: client}}, Arriving: refused}); err == nil {
		t.Fatal("a truncated body was forwarded")
	}
	if released != 4 {
		t.Fatalf("released %d times, want 4", released)
	}
}

// Sent tells the next body how the previous request went: its changes in
// the part the two may share as they were, those after it at the same
// distance from the end, and nothing when a change straddles the shared
// part's end, the changes remove most of the body, or the previous request
// is not told by changes.
func TestArrivingSentMapsThePreviousChanges(t *testing.T) {
	arriving := func(shared int, s *sentAs) *Arriving {
		sent := new(atomic.Pointer[sentAs])
		sent.Store(s)
		return &Arriving{prev: resumed{res: &wire.Resume{Body: make([]byte, shared)}, sent: sent}}
	}
	marker := wire.Change{From: 10, To: 50, With: []string{`"[image removed]"`}}
	asked := wire.Change{From: 99, To: 99, With: []string{`,"stream_options":{"include_usage":true}`}}
	got, ok := arriving(80, &sentAs{changes: []wire.Change{marker, asked}, n: 100}).Sent(130)
	want := []wire.Change{marker, {From: 129, To: 129, With: asked.With}}
	if !ok || !slices.EqualFunc(got, want, wire.Change.Equal) {
		t.Fatalf("Sent = %v, %v; want %v", got, ok, want)
	}
	if got, ok := arriving(80, &sentAs{n: 100}).Sent(130); !ok || len(got) != 0 {
		t.Fatalf("a request sent as it came: %v, %v", got, ok)
	}
	straddles := wire.Change{From: 70, To: 90}
	if _, ok := arriving(80, &sentAs{changes: []wire.Change{straddles}, n: 100}).Sent(130); ok {
		t.Fatal("a change across the shared part's end was made again")
	}
	if _, ok := arriving(80, &sentAs{changes: []wire.Change{{From: 85, To: 90}}, n: 100}).Sent(90); ok {
		t.Fatal("a change after the shared part, moved into it by a shorter body, was made again")
	}
	if _, ok := arriving(80, &sentAs{changes: []wire.Change{{From: 0, To: 80}}, n: 100}).Sent(100); ok {
		t.Fatal("changes that leave a fifth of the body were made again")
	}
	if _, ok := arriving(80, nil).Sent(130); ok {
		t.Fatal("a request not told by changes gave some")
	}
	if _, ok := (*Arriving)(nil).Sent(130); ok {
		t.Fatal("no previous request gave changes")
	}
}
