package gateway

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// bodyPool recycles the buffers proxied bodies are read into: a fresh
// multi-megabyte buffer per request costs its zeroing, page faults and
// garbage collection — more than scanning it. Buffers come in sizes eight
// to an octave from 64 KB to 64 MB (64, 72, 80, …, 120, 128 KB, …), so a
// body's buffer is at most an eighth larger than the body (a 2.15 MB agent
// body in 2.25 MB, where four to an octave took 2.5); a body is handed back
// only once every reader of the request built from it is closed
// (wire.Body.Tracked).
//
// The buffers live outside the Go heap where the system allows it
// (mapBuffer): they are pointer-free bytes the collector never needs to
// scan, and on the heap they set its pace — the heap it lets grow before
// collecting is twice the live one, so 40 MB of bodies in flight made
// 80 MB of garbage room besides them. Off the heap, a process's memory is
// the bodies it holds plus a heap sized by everything else. Idle buffers
// are kept up to maxIdleBodies bytes (or one, however large), and for
// idleFor; past either the longest idle go back to the system (on the
// heap, the collector took them back within two collections).
type bodyPool struct {
	mu       sync.Mutex
	free     [len(poolSizes)][]idleBuffer // oldest first
	idle     int                          // bytes in free
	owned    map[*byte]struct{}           // the buffers this pool made, in use or free
	held     atomic.Int64                 // their bytes
	idleFor  time.Duration                // 0: bodyIdleFor
	trimming bool                         // a trim is due
}

// idleBuffer is a buffer in the free list, and since when.
type idleBuffer struct {
	b     []byte
	since time.Time
}

// bodyBuffers is the process's pool: memory is the process's, whichever
// server reads into it.
var bodyBuffers = new(bodyPool)

const (
	minPooled     = 64 << 10
	maxIdleBodies = 32 << 20
	bodyIdleFor   = time.Minute
)

// poolSizes are the buffer sizes, ascending.
var poolSizes = func() [81]int {
	var s [81]int
	for i := range s {
		octave, step := i/8, i%8
		s[i] = (minPooled << octave) + step*(minPooled<<octave)/8
	}
	return s
}()

// class is the smallest size class holding n (len(poolSizes) when none).
func class(n int) int {
	c, _ := slices.BinarySearch(poolSizes[:], n)
	return c
}

// get returns a buffer of length n, and whether it is the pool's (to put
// back); one under 64 KB is not pooled, its allocation being cheaper than
// the bookkeeping.
func (p *bodyPool) get(n int) (b []byte, pooled bool) {
	c := class(n)
	if n < minPooled || c >= len(p.free) {
		return make([]byte, n), false
	}
	p.mu.Lock()
	if k := len(p.free[c]); k > 0 {
		b := p.free[c][k-1].b
		p.free[c] = p.free[c][:k-1]
		p.idle -= cap(b)
		p.mu.Unlock()
		return b[:n], true
	}
	p.mu.Unlock()
	b = mapBuffer(poolSizes[c])
	p.mu.Lock()
	if p.owned == nil {
		p.owned = map[*byte]struct{}{}
	}
	p.owned[unsafe.SliceData(b)] = struct{}{}
	p.held.Add(int64(cap(b)))
	p.mu.Unlock()
	return b[:n], true
}

// put hands b back for reuse; the caller must not touch it again.
func (p *bodyPool) put(b []byte) {
	if cap(b) < minPooled {
		return
	}
	b = b[:cap(b)]
	p.mu.Lock()
	if _, ok := p.owned[unsafe.SliceData(b)]; !ok {
		p.mu.Unlock()
		return
	}
	// Room is made by letting the longest idle go: the buffer just put is
	// the likeliest to be asked for next (the same conversation, grown by
	// a round), and one is kept however large.
	for p.idle > 0 && p.idle+cap(b) > maxIdleBodies {
		p.releaseOldest()
	}
	c := class(cap(b))
	p.free[c] = append(p.free[c], idleBuffer{b, time.Now()})
	p.idle += cap(b)
	if !p.trimming {
		p.trimming = true
		time.AfterFunc(p.idleTime(), p.trim)
	}
	p.mu.Unlock()
}

// releaseOldest hands back the buffer idle the longest; under p.mu.
func (p *bodyPool) releaseOldest() {
	oldest := -1
	for c, list := range p.free {
		if len(list) > 0 && (oldest < 0 || list[0].since.Before(p.free[oldest][0].since)) {
			oldest = c
		}
	}
	b := p.free[oldest][0].b
	p.free[oldest] = slices.Delete(p.free[oldest], 0, 1)
	p.idle -= cap(b)
	p.release(b)
}

func (p *bodyPool) idleTime() time.Duration {
	if p.idleFor > 0 {
		return p.idleFor
	}
	return bodyIdleFor
}

// trim hands back the buffers idle for idleFor, and comes again when the
// oldest left will have been.
func (p *bodyPool) trim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	var next time.Time
	for c, list := range p.free {
		n := 0
		for n < len(list) && now.Sub(list[n].since) >= p.idleTime() {
			p.idle -= cap(list[n].b)
			p.release(list[n].b)
			n++
		}
		p.free[c] = slices.Delete(list, 0, n)
		if len(p.free[c]) > 0 && (next.IsZero() || p.free[c][0].since.Before(next)) {
			next = p.free[c][0].since
		}
	}
	p.trimming = !next.IsZero()
	if p.trimming {
		time.AfterFunc(next.Add(p.idleTime()).Sub(now), p.trim)
	}
}

// release forgets b and hands its memory back; under p.mu.
func (p *bodyPool) release(b []byte) {
	delete(p.owned, unsafe.SliceData(b))
	p.held.Add(-int64(cap(b)))
	unmapBuffer(b)
}

// bodyRef counts the readers of one request's body buffer — the handler,
// the upstream's readers of it, the conversation's resume —; the last one
// done puts the buffer back in the pool, unless the conversation's next
// request took it over to read its own body into (engine.Handover).
type bodyRef struct {
	b    []byte // the pool's buffer; nil when the body is not pooled
	refs atomic.Int64
}

func (r *bodyRef) Add(n int) { r.refs.Add(int64(n)) }

func (r *bodyRef) Done() {
	if r.refs.Add(-1) == 0 && r.b != nil {
		bodyBuffers.put(r.b)
	}
}

// Take hands the buffer over when b starts it and the caller's reference
// is the last: no reader is left to see it change.
func (r *bodyRef) Take(b []byte) bool {
	return r.b != nil && unsafe.SliceData(b) == unsafe.SliceData(r.b) && r.refs.CompareAndSwap(1, 0)
}
