package upstream

import (
	"context"
	"errors"
	"io"
	"maps"
	"net/http"
	"slices"
	"sync"
)

// Early is a request sent while its body is still being read from the
// client, on the guess that it will go upstream as the client sent it (the
// conversation's requests so far all did): the bytes the caller lets go
// (Advance) leave as they arrive, never the last, which waits for the
// decision. When the decided
// body is the client's bytes as they are, the request finishes
// (Request.Early); otherwise it is abandoned before its last byte — the
// connection closed under it, so the upstream never reads a whole request
// — and the decided body is sent as any other. A body written through a
// gateway then costs its read and its write at once, as a plain proxy's
// does, instead of one after the other.
type Early struct {
	r      Request // what it was started as: Path, Query, Header, APIKey
	buf    []byte  // the client's body, filled as it is read
	cancel context.CancelFunc
	done   chan struct{} // closed when the upstream answered or failed
	resp   *http.Response
	err    error

	mu      sync.Mutex
	more    *sync.Cond
	avail   int   // bytes of buf that may go before the decision (Advance)
	decided bool  // the decided body is buf: all of it may go
	dropped error // abandoned
	taken   bool
	pos     int // bytes given to the transport
	closed  sync.Once
	onClose func()
}

// errAbandoned is what the transport reads from an abandoned request.
var errAbandoned = errors.New("upstream: request abandoned for the body the gateway decided")

// Start sends the request r will be, its body the len(buf) bytes buf will
// hold as the client's body arrives; onClose runs once the
// transport is done reading buf. Finish it by sending r with Early set, or
// Abandon it.
func (c *Client) Start(ctx context.Context, r Request, buf []byte, onClose func()) *Early {
	e := &Early{r: r, buf: buf, done: make(chan struct{}), onClose: onClose}
	e.more = sync.NewCond(&e.mu)
	ctx, e.cancel = context.WithCancel(ctx)
	req, err := c.request(ctx, r, e, int64(len(buf)))
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
	e.mu.Unlock()
	e.more.Broadcast()
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
// the client's bytes as they are; otherwise it abandons it. False when
// there is none.
func (e *Early) take(r Request) bool {
	if e == nil {
		return false
	}
	same := r.Path == e.r.Path && r.Query == e.r.Query && r.APIKey == e.r.APIKey && r.Method == e.r.Method &&
		r.Body.Is(e.buf) && maps.EqualFunc(r.Header, e.r.Header, slices.Equal)
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
	b, err := e.next(len(p))
	return copy(p, b), err
}

// next is the run of the body that may go now, at most max bytes, waiting
// for one: a piece of buf itself, which holds no byte before its release
// that changes once it arrived, so a connection writes it without a copy.
func (e *Early) next(max int) ([]byte, error) {
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
		if e.pos < limit {
			b := e.buf[e.pos:min(limit, e.pos+max)]
			e.pos += len(b)
			return b, nil
		}
		if e.decided {
			return nil, io.EOF
		}
		e.more.Wait()
	}
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
