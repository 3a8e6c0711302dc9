package engine

import (
	"net/http"
	"sync"

	"github.com/imgctx/imgctx/wire"
)

// ArrivingHead is how much of a body names its conversation (with the
// tenant, the wire and the agent's conversation headers): Arriving needs
// it first.
const ArrivingHead = 4096

// Arriving is a body still being read, compared as it comes with its
// conversation's previous request. An agent re-sends the whole history
// every time; the resumed scan must check that the bytes it takes over are
// the previous request's, a memory compare of the whole history. Done
// while the rest of the body is on the way, it costs no time after the
// last byte (ProxyCall.Arriving).
type Arriving struct {
	key      resumeKey
	prev     resumed
	known    int // leading bytes equal to the previous request's
	diverged bool
	inPlace  bool       // the body is read into the previous request's memory (Take)
	spans    *spanCache // where prev is kept
	once     sync.Once
	done     func()
}

// Arriving starts comparing a body with its conversation's previous
// request; head is its first ArrivingHead bytes (all of it when shorter).
// It is nil when the conversation has none. Hand it to Proxy with the
// body, or Release it.
func (e *Engine) Arriving(tenant string, d *wire.Dialect, h http.Header, head []byte) *Arriving {
	e.once.Do(e.init)
	k := e.spans.resumeKeyOf(tenant, d.Name, h, head)
	prev, done := e.spans.resumeFor(k)
	if prev.res == nil {
		done()
		return nil
	}
	a := &Arriving{key: k, prev: prev, spans: e.spans, done: done}
	a.Compare(0, head)
	return a
}

// Compare takes the bytes b read at offset off, in order.
func (a *Arriving) Compare(off int, b []byte) {
	if a == nil || a.diverged {
		return
	}
	p := a.prev.res.Body
	if off != a.known || off >= len(p) {
		a.diverged = true
		return
	}
	m := min(len(b), len(p)-off)
	n := wire.CommonPrefix(p[off:off+m], b[:m])
	a.known += n
	a.diverged = n < len(b)
}

// Take hands over the previous request's memory for this body, n bytes
// long, to be read into where it stands: the bytes the two share are there
// already, and a conversation holds one body instead of two while its next
// one arrives. The caller must then read in order, each read compared
// before it is written (ReadsAside), and write only what differs. It returns
// nil unless the body's first bytes were the previous request's and its
// memory is a buffer that holds n bytes, at most an eighth more (a history
// cut short by a compaction gets a buffer of its size), which nothing but
// its resume reads (no other scan of it, no reader upstream, the request
// done); the conversation's resume is gone then, and the buffer is the
// caller's.
func (a *Arriving) Take(n int) []byte {
	if a == nil || a.diverged {
		return nil
	}
	b := a.prev.res.Body
	if cap(b) < n || cap(b) > n+n/8 || !a.spans.take(a.key, a.prev) {
		return nil
	}
	a.inPlace = true
	return b[:n]
}

// ReadsAside reports whether the bytes at off are to be read aside and
// compared before they are written: the body is read into the previous
// request's memory (Take), and every byte before off was found equal to
// it, which goes on past off. Only from the first that differs are they
// written there.
func (a *Arriving) ReadsAside(off int) bool {
	return a != nil && a.inPlace && !a.diverged && a.known == off && off < len(a.prev.res.Body)
}

// resume is what the scan resumes from. In a taken buffer only the bytes
// found equal are still the previous request's: the rest is this body's.
func (a *Arriving) resume() resumed {
	r := a.prev
	if a.inPlace && a.known < len(r.res.Body) {
		p := r.res
		r.res = &wire.Resume{Body: p.Body[:a.known], Messages: p.Messages, Slots: p.Slots, Marks: p.Marks}
	}
	return r
}

// Known is how many leading bytes of the body are the previous request's,
// up to the end of its last message: a JSON object left open, which may go
// upstream before the body is decided (upstream.Early) — no upstream can
// read a whole request in it.
func (a *Arriving) Known() int {
	if a == nil {
		return 0
	}
	return a.known
}

// Sent is how the conversation's previous request went upstream, told as
// the changes that would make this body, n bytes long, go the same way
// (none when it went as its client sent it): those in the part the two
// may share, as they were, and those after it at the same distance from
// the end (a field added at the body's end). ok is false when that is not
// known, a change straddles the shared part's end, or the changes leave
// less than a quarter of the body: with most of it removed (a history of
// screenshots, all but a few replaced by markers) little would go early,
// and on a busy machine the early request cost more than it saved
// (BENCHMARKS.md, "Early requests with changes"). The guess is checked
// against the decided body (upstream.Early).
func (a *Arriving) Sent(n int) (changes []wire.Change, ok bool) {
	if a == nil || a.prev.sent == nil {
		return nil, false
	}
	s := a.prev.sent.Load()
	if s == nil {
		return nil, false
	}
	shared := len(a.prev.res.Body)
	changes = make([]wire.Change, 0, len(s.changes))
	for _, c := range s.changes {
		if c.From < shared && c.To > shared {
			return nil, false
		}
		if c.From >= shared {
			c.From, c.To = c.From+n-s.n, c.To+n-s.n
			if c.From < shared {
				return nil, false
			}
		}
		changes = append(changes, c)
	}
	return changes, wire.ChangedLen(n, changes) >= n/4
}

// Release lets the previous request's memory go. Proxy does it for the
// body it is handed; a second call does nothing.
func (a *Arriving) Release() {
	if a != nil {
		a.once.Do(a.done)
	}
}

// resumeFrom returns the previous request of the conversation k names,
// held until done is called, and how many of its leading bytes the body
// was found to share as it arrived: arriving's, when it was compared with
// that conversation's.
func (e *Engine) resumeFrom(k resumeKey, arriving *Arriving) (r resumed, known int, done func()) {
	if arriving != nil && arriving.key == k {
		return arriving.resume(), arriving.known, arriving.Release
	}
	arriving.Release()
	r, done = e.spans.resumeFor(k)
	return r, 0, done
}
