package upstream

import (
	"context"
	"io"
	"math"
	"net"
	"net/http"
)

// NewTransport is http.DefaultTransport's clone whose plain TCP
// connections take a request body that can hand over its bytes (wire.Body's
// readers) in vectored writes. net/http copies a body of known length
// through a 32 KB buffer, a write call for each: a 4 MB history re-sent to a
// local model server is then 120 copies and writes; handed over whole it is
// a few writev calls and no copy. TLS connections are unchanged.
func NewTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	dial := t.DialContext // the default's dialer, with its timeouts
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok {
			return &vectorConn{tc}, nil
		}
		return c, err
	}
	return t
}

// vectorConn is a TCP connection whose ReadFrom writes a body's rest as
// it is. The transport reaches it through io.Copy with the body under an
// io.LimitedReader of the declared length.
type vectorConn struct{ *net.TCPConn }

// rester is a body that can hand over what is left of it (wire.Body's
// readers).
type rester interface {
	Rest(max int64) ([][]byte, bool)
}

func (c *vectorConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if e, ok := lr.R.(*Early); ok {
			return c.writeEarly(e, lr)
		}
		if b, ok := lr.R.(rester); ok {
			if bufs, ok := b.Rest(lr.N); ok {
				v := net.Buffers(bufs)
				n, err := v.WriteTo(c.TCPConn)
				lr.N -= n
				return n, err
			}
		}
	}
	return c.TCPConn.ReadFrom(r)
}

// writeEarly writes an early request's body from the client's buffer as
// its runs are let go, with no copy through the transport's buffer: what
// is ready at once in one vectored write.
func (c *vectorConn) writeEarly(e *Early, lr *io.LimitedReader) (int64, error) {
	var n int64
	for lr.N > 0 {
		bufs, err := e.next(int(min(lr.N, int64(math.MaxInt))))
		if len(bufs) > 0 {
			v := net.Buffers(bufs)
			w, werr := v.WriteTo(c.TCPConn)
			n += w
			lr.N -= w
			if werr != nil {
				return n, werr
			}
		}
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
