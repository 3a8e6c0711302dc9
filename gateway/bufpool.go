package gateway

import (
	"math/bits"
	"sync"
)

// bodyPool recycles the buffers proxied bodies are read into: a fresh
// multi-megabyte buffer per request costs its zeroing, page faults and
// garbage collection — more than scanning it. Buffers come in power-of-two
// sizes from 64 KB to 64 MB; a body is handed back only once every reader
// of the request built from it is closed (wire.Body.Tracked).
type bodyPool struct {
	classes [11]sync.Pool // 64 KB << i
}

const minPooled = 64 << 10

func class(n int) int {
	if n <= minPooled {
		return 0
	}
	return bits.Len(uint(n-1)) - bits.Len(uint(minPooled-1))
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
	return make([]byte, n, minPooled<<c)
}

// pooled reports whether b is a buffer put takes back.
func (p *bodyPool) pooled(b []byte) bool {
	c := class(cap(b))
	return cap(b) >= minPooled && c < len(p.classes) && cap(b) == minPooled<<c
}

// put hands b back for reuse; the caller must not touch it again.
func (p *bodyPool) put(b []byte) {
	c := class(cap(b))
	if c < len(p.classes) && cap(b) == minPooled<<c {
		p.classes[c].Put(&b)
	}
}
