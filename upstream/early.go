package upstream

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
	"unsafe"

	"github.com/imgctx/imgctx/wire"
)

// Early is a request sent while its body is still being read from the
// client, on the guess that it will go upstream as the client sent it, or
// with the changes the gateway made to the conversation's previous
// request made again (markers where it removed images): the bytes the
// caller lets go (Advance), changed so, leave as they arrive, never the
// last, which waits for the decision. When the decided body is the
// client's bytes with exactly those changes, the request finishes
// (Request.Early); otherwise it is abandoned before its last byte — the
// connection closed under it, so the upstream never reads a whole request
// — and the decided body is sent as any other. A body written through a
// gateway then costs its read and its write at once, as a plain proxy's
// does, instead of one after the other.
type Early struct {
	r       Request       // what it was started as: Path, Query, Header, APIKey
	buf     []byte        // the client's body, filled as it is read
	changes []wire.Change // what the guess changes in buf, in order
	cancel  context.CancelFunc
	done    chan struct{} // closed when the upstream answered or failed
	resp    *http.Response
	err     error

	mu      sync.Mutex
	more    *sync.Cond
	avail   int   // bytes of buf that may go before the decision (Advance)
	decided bool  // the decided body is buf: all of it may go
	dropped error // abandoned
	taken   bool
	// What was given to the transport: buf up to pos, the changes before
	// changes[ch], and of changes[ch] the strings before with, and off
	// bytes of that one.
	pos, ch, with, off int
	closed             sync.Once
	onClose            func()
}

// errAbandoned is what the transport reads from an abandoned request.
var errAbandoned = errors.New("upstream: request abandoned for the body the gateway decided")

// Start sends the request r will be, its body the len(buf) bytes buf will
// hold as the client's body arrives with changes made to them (in order,
// not overlapping; none for the client's bytes as they are); onClose runs
// once the transport is done reading buf. Finish it by sending r with
// Early set, or Abandon it.
func (c *Client) Start(ctx context.Context, r Request, buf []byte, changes []wire.Change, onClose func()) *Early {
	e := &Early{r: r, buf: buf, changes: changes, done: make(chan struct{}), onClose: onClose}
	e.more = sync.NewCond(&e.mu)
	ctx, e.cancel = context.WithCancel(ctx)
	req, err := c.request(ctx, r, e, int64(wire.ChangedLen(len(buf), changes)))
	if err != nil {
		e.err = err
		close(e.done)
		return e
	}
	go func() {
		e.resp, e.err = c.httpClient().Do(req)
		close(e.done)
	}()
	return e
}

// Advance lets the first n bytes of buf go upstream (the gateway: those
// that repeat the previous request, arrived). Never the body's last byte
// before the decision: the upstream reads no whole request until then.
func (e *Early) Advance(n int) {
	if e == nil {
		return
	}
	e.mu.Lock()
	e.avail = n
	// Not woken for a read that only went further into what a change
	// replaces (an image's base64): nothing more may go.
	ready := e.ready(min(n, len(e.buf)-1))
	e.mu.Unlock()
	if ready {
		e.more.Broadcast()
	}
}

// ready reports whether some bytes may go once the client's bytes up to
// limit may. The caller holds mu.
func (e *Early) ready(limit int) bool {
	if e.ch < len(e.changes) && e.changes[e.ch].From == e.pos {
		return e.changes[e.ch].To <= limit
	}
	return e.pos < limit
}

// Abandon stops the request short of its last byte, if the decision did
// not take it. Safe to call more than once, and after it was taken.
func (e *Early) Abandon() {
	if e == nil {
		return
	}
	e.mu.Lock()
	if !e.taken && e.dropped == nil {
		e.dropped = errAbandoned
	}
	taken := e.taken
	e.mu.Unlock()
	e.more.Broadcast()
	if taken {
		return
	}
	e.cancel()
	go func() { // an answer that came before the body's end is not read
		<-e.done
		if e.resp != nil {
			e.resp.Body.Close()
		}
	}()
}

// take finishes the request when r is what it was started as and its body
// the client's bytes with the changes it was started with; otherwise it
// abandons it. False when there is none.
func (e *Early) take(r Request) bool {
	if e == nil {
		return false
	}
	same := r.Path == e.r.Path && r.Query == e.r.Query && r.APIKey == e.r.APIKey && r.Method == e.r.Method &&
		maps.EqualFunc(r.Header, e.r.Header, slices.Equal) && e.madeOf(r.Body)
	e.mu.Lock()
	ok := same && e.dropped == nil && !e.taken
	if ok {
		e.taken, e.decided = true, true
	}
	e.mu.Unlock()
	if !ok {
		e.Abandon()
		return false
	}
	e.more.Broadcast()
	return true
}

// wait is the upstream's answer to a request taken.
func (e *Early) wait() (*http.Response, error) {
	<-e.done
	return e.resp, e.err
}

// Read gives the transport the body's bytes as they arrive: all but the
// last until the request is taken.
func (e *Early) Read(p []byte) (int, error) {
	bufs, err := e.next(len(p))
	n := 0
	for _, b := range bufs {
		n += copy(p[n:], b)
	}
	return n, err
}

// next is what may go now, at most max bytes, waiting for some: pieces of
// buf itself, which holds no byte before its release that changes once it
// arrived, and of the changes' strings, so a connection writes them
// without a copy, in one call.
func (e *Early) next(max int) ([][]byte, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for {
		if e.dropped != nil {
			return nil, e.dropped
		}
		limit := min(e.avail, len(e.buf)-1)
		if e.decided {
			limit = len(e.buf)
		}
		var bufs [][]byte
		for b := e.run(limit, max); len(b) > 0; b = e.run(limit, max) {
			bufs = append(bufs, b)
			max -= len(b)
		}
		if len(bufs) > 0 {
			return bufs, nil
		}
		if e.decided && e.pos == len(e.buf) && e.ch == len(e.changes) {
			return nil, io.EOF
		}
		e.more.Wait()
	}
}

// run is next's next piece when the client's bytes up to limit may go: a
// change goes once all it replaces may. The caller holds mu.
func (e *Early) run(limit, max int) []byte {
	if max <= 0 {
		return nil
	}
	for e.ch < len(e.changes) && e.changes[e.ch].From == e.pos {
		c := e.changes[e.ch]
		if c.To > limit {
			return nil
		}
		for ; e.with < len(c.With); e.with, e.off = e.with+1, 0 {
			if s := c.With[e.with][e.off:]; s != "" {
				n := min(len(s), max)
				e.off += n
				return unsafe.Slice(unsafe.StringData(s), n)
			}
		}
		e.pos, e.ch, e.with = c.To, e.ch+1, 0
	}
	end := limit
	if e.ch < len(e.changes) {
		end = min(end, e.changes[e.ch].From)
	}
	if e.pos >= end {
		return nil
	}
	b := e.buf[e.pos:min(end, e.pos+max)]
	e.pos += len(b)
	return b
}

// madeOf reports whether body is the client's buffer with the request's
// changes made, piece for piece.
func (e *Early) madeOf(body wire.Body) bool {
	if len(e.changes) == 0 {
		return body.Is(e.buf)
	}
	// Copies past the changes' own bytes could not match them.
	changes, ok := body.Changes(e.buf, wire.Written(e.changes))
	return ok && slices.EqualFunc(changes, e.changes, wire.Change.Equal)
}

// Close is the transport's: it is done with the body.
func (e *Early) Close() error {
	e.closed.Do(func() {
		if e.onClose != nil {
			e.onClose()
		}
	})
	return nil
}
