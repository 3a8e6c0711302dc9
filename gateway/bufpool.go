package gateway

import (
	"slices"
	"sync"
)

// bodyPool recycles the buffers proxied bodies are read into: a fresh
// multi-megabyte buffer per request costs its zeroing, page faults and
// garbage collection — more than scanning it. Buffers come in sizes four to
// an octave from 64 KB to 64 MB (64, 80, 96, 112, 128 KB, …), so a body's
// buffer is at most a quarter larger than the body (power-of-two sizes
// held up to twice it: a 2.2 MB body in 4 MB); a body is handed back only
// once every reader of the request built from it is closed
// (wire.Body.Tracked).
type bodyPool struct {
	classes [len(poolSizes)]sync.Pool
}

const minPooled = 64 << 10

// poolSizes are the buffer sizes, ascending.
var poolSizes = func() [41]int {
	var s [41]int
	for i := range s {
		octave, step := i/4, i%4
		s[i] = (minPooled << octave) + step*(minPooled<<octave)/4
	}
	return s
}()

// class is the smallest size class holding n (len(poolSizes) when none).
func class(n int) int {
	c, _ := slices.BinarySearch(poolSizes[:], n)
	return c
}

// get returns a buffer of length n; one under 64 KB is not pooled, its
// allocation being cheaper than the bookkeeping.
func (p *bodyPool) get(n int) []byte {
	c := class(n)
	if n < minPooled || c >= len(p.classes) {
		return make([]byte, n)
	}
	if b, ok := p.classes[c].Get().(*[]byte); ok {
		return (*b)[:n]
	}
	return make([]byte, n, poolSizes[c])
}

// pooled reports whether b is a buffer put takes back.
func (p *bodyPool) pooled(b []byte) bool {
	c := class(cap(b))
	return c < len(p.classes) && cap(b) == poolSizes[c]
}

// put hands b back for reuse; the caller must not touch it again.
func (p *bodyPool) put(b []byte) {
	if p.pooled(b) {
		p.classes[class(cap(b))].Put(&b)
	}
}
