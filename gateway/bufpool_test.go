package gateway

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/imgctx/imgctx/upstream"
)

// owns reports whether b is a buffer p made (and put takes back).
func owns(p *bodyPool, b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.owned[unsafe.SliceData(b)]
	return ok
}

// inUse is the bytes of p's buffers not idle.
func inUse(p *bodyPool) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held.Load() - int64(p.idle)
}

// Pooled body buffers come in the sizes put takes back, at most an eighth
// larger than the body; small ones are not pooled.
func TestBodyPoolSizes(t *testing.T) {
	var p bodyPool
	for _, n := range []int{1, 1000, 64 << 10, 64<<10 + 1, 80<<10 + 1, 2_154_944, 40 << 20, 64 << 20} {
		b, pooled := p.get(n)
		if len(b) != n || pooled != (n >= minPooled) || owns(&p, b) != pooled {
			t.Fatalf("get(%d): len %d cap %d pooled %v, owned %v", n, len(b), cap(b), pooled, owns(&p, b))
		}
		if owns(&p, b) && (cap(b) < n || cap(b) > n+n/8) {
			t.Fatalf("get(%d): cap %d, more than an eighth over", n, cap(b))
		}
		c := cap(b)
		p.put(b)
		if again, _ := p.get(n); n >= minPooled && cap(again) != c {
			t.Fatalf("get(%d) after put: cap %d; want %d", n, cap(again), c)
		}
	}
}

// A buffer put back is the next one of its size, its bytes as they were
// left; past maxIdleBodies the buffers idle longest go back to the system
// (one is kept however large), and a buffer the pool did not make is never
// taken, whatever its size.
func TestBodyPoolReusesAndBoundsIdle(t *testing.T) {
	var p bodyPool
	b, _ := p.get(1 << 20)
	b[0], b[len(b)-1] = 'a', 'z'
	p.put(b)
	again, _ := p.get(1 << 20)
	if unsafe.SliceData(again) != unsafe.SliceData(b) || again[0] != 'a' || again[len(again)-1] != 'z' {
		t.Fatal("the buffer put back was not the next one got")
	}
	p.put(again)

	var held [][]byte
	for range 2 * maxIdleBodies / (4 << 20) {
		b, _ := p.get(4 << 20)
		held = append(held, b)
	}
	for _, b := range held {
		p.put(b)
	}
	if p.idle != maxIdleBodies || len(p.owned) != maxIdleBodies/(4<<20) || p.held.Load() != maxIdleBodies {
		t.Fatalf("%d bytes idle, %d buffers of %d bytes owned after putting %d; want the bound, in 4 MB buffers only", p.idle, len(p.owned), p.held.Load(), 2*maxIdleBodies)
	}
	last := held[len(held)-maxIdleBodies/(4<<20):] // the newest put are kept
	for _, b := range last {
		if !owns(&p, b) {
			t.Fatal("a buffer put last was let go before one idle longer")
		}
	}

	huge, _ := p.get(maxIdleBodies + 1)
	p.put(huge)
	if len(p.owned) != 1 || !owns(&p, huge) || p.idle != cap(huge) {
		t.Fatalf("after a buffer over the bound: %d owned, %d idle; want it alone", len(p.owned), p.idle)
	}

	foreign := make([]byte, 1<<20, poolSizes[class(1<<20)])
	if owns(&p, foreign) {
		t.Fatal("a buffer the pool did not make is said to be pooled")
	}
	idle := p.idle
	p.put(foreign)
	if p.idle != idle {
		t.Fatal("a buffer the pool did not make was taken")
	}
}

// The buffers are outside the Go heap (where the system maps memory):
// the collector's pace is set by the rest of the process, not by the
// bodies in flight.
func TestBodyPoolBuffersAreOffTheHeap(t *testing.T) {
	if !mapsBuffers {
		t.Skip("no anonymous mappings: the pool uses the heap")
	}
	var p bodyPool
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	b, _ := p.get(64 << 20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 16<<20 {
		t.Fatalf("the heap grew by %d bytes for a 64 MB body buffer", grew)
	}
	p.put(b)
}

// A body that never arrives whole still hands its buffer back: outside the
// heap, nothing else would free it. Five clients promise 2 MB, send 100 KB
// and hang up; the buffers in use return to what they were.
func TestBodyBuffersOfCutBodiesGoBack(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	before := inUse(bodyBuffers)
	for range 5 {
		conn, err := net.Dial("tcp", strings.TrimPrefix(g.srv.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":\"%s", 2<<20, strings.Repeat("a", 100<<10))
		time.Sleep(20 * time.Millisecond) // read into its buffer
		conn.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for inUse(bodyBuffers) != before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if now := inUse(bodyBuffers); now != before {
		t.Fatalf("%d bytes of body buffers in use after the cut bodies; %d before", now, before)
	}
}

// Idle buffers go back to the system once idle for idleFor, as the heap's
// did within two collections; one in use is not touched.
func TestBodyPoolHandsIdleBuffersBack(t *testing.T) {
	p := bodyPool{idleFor: 20 * time.Millisecond}
	a, _ := p.get(1 << 20)
	b, _ := p.get(2 << 20)
	p.put(a)
	p.put(b)
	kept, _ := p.get(1 << 20) // in use again before the trim
	if p.held.Load() != int64(cap(a)+cap(b)) {
		t.Fatalf("%d bytes held; want both buffers", p.held.Load())
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.held.Load() != int64(cap(kept)) && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held.Load() != int64(cap(kept)) || p.idle != 0 || len(p.owned) != 1 {
		t.Fatalf("after idleFor: %d bytes held, %d idle, %d owned; want only the buffer in use", p.held.Load(), p.idle, len(p.owned))
	}
}

// /metrics reports the buffers outside the heap: a 100 KB body's is among
// them once it has been read.
func TestBodyBufferBytesAreAMetric(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	body := `{"model":"gpt-4o","messages":[{"role":"user","content":"` + strings.Repeat("a", 100<<10) + `"}]}`
	if resp, answer := g.do(t, "POST", "/v1/chat/completions", "", []byte(body)); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, answer)
	}
	var got float64
	if _, err := fmt.Sscanf(metric(t, g, "imgctx_body_buffer_bytes "), "imgctx_body_buffer_bytes %g", &got); err != nil {
		t.Fatal(err)
	}
	if got < float64(len(body)) || got != float64(bodyBuffers.held.Load()) {
		t.Fatalf("imgctx_body_buffer_bytes %g; want the pool's %d, at least the body's %d", got, bodyBuffers.held.Load(), len(body))
	}
}
