package wire

import (
	"io"
	"slices"
	"sync"
	"unsafe"
)

// Body is a request body held as pieces, so that large strings (an image's
// cached base64) go to the network without first being copied into one
// buffer. The zero Body is empty.
type Body struct {
	pieces []piece
	n      int
	open   Readers // counts readers not closed yet, when tracked
}

// Readers counts the readers of a buffer (a *sync.WaitGroup does), so
// that whoever owns it reuses it only once every reader is done.
type Readers interface {
	Add(delta int)
	Done()
}

// Tracked returns the body with its readers counted on r: each
// ReadCloser adds one and its Close marks it done, so a caller whose buffer
// the pieces point into can reuse it once they all are — the HTTP
// transport may still be reading a request body after the response came.
func (b Body) Tracked(r Readers) Body {
	b.open = r
	return b
}

// ReadCloser is Reader with a Close that marks a tracked reader done.
func (b Body) ReadCloser() io.ReadCloser {
	if b.open == nil {
		return io.NopCloser(b.Reader()) // NopCloser keeps the reader's WriteTo
	}
	b.open.Add(1)
	return &trackedReader{piecesReader: &piecesReader{pieces: b.pieces}, done: b.open.Done}
}

type trackedReader struct {
	*piecesReader // its Read, WriteTo and Rest
	once          sync.Once
	done          func()
}

func (r *trackedReader) Close() error {
	r.once.Do(r.done)
	return nil
}

// piece is a string or a byte slice, held without copying.
type piece struct {
	s string
	b []byte
}

// BodyOf wraps bytes already assembled, without copying them.
func BodyOf(b []byte) Body { return Body{pieces: []piece{{b: b}}, n: len(b)} }

// Is reports whether the body is buf as it is: buf's own memory, whole,
// in one piece (a request forwarded unchanged).
func (b Body) Is(buf []byte) bool {
	return len(b.pieces) == 1 && len(buf) > 0 && len(b.pieces[0].b) == len(buf) && &b.pieces[0].b[0] == &buf[0]
}

// A Change replaces buf[From:To] with the strings of With, in turn.
type Change struct {
	From, To int
	With     []string
}

// Equal reports whether c and d make the same change, piece for piece.
func (c Change) Equal(d Change) bool {
	return c.From == d.From && c.To == d.To && slices.Equal(c.With, d.With)
}

// Changes tells the body as the changes that make it from buf, the
// client's body it was spliced from (Splice): its runs of buf's own
// memory, in order, are kept bytes, and the pieces between them replace
// what they skip. Pieces of other memory are copied into With, at most
// maxCopied bytes of them in all; strings are taken as they are. ok is
// false when a run goes back in buf or the copies would pass maxCopied.
func (b Body) Changes(buf []byte, maxCopied int) (changes []Change, ok bool) {
	at, copied := 0, 0
	var with []string
	for _, p := range b.pieces {
		if len(p.b)+len(p.s) == 0 {
			continue
		}
		if off, in := offsetIn(p.b, buf); in {
			if off < at {
				return nil, false
			}
			if off > at || with != nil {
				changes = append(changes, Change{From: at, To: off, With: with})
				with = nil
			}
			at = off + len(p.b)
			continue
		}
		s := p.s
		if p.b != nil {
			if copied += len(p.b); copied > maxCopied {
				return nil, false
			}
			s = string(p.b)
		}
		with = append(with, s)
	}
	if at < len(buf) || with != nil {
		changes = append(changes, Change{From: at, To: len(buf), With: with})
	}
	return changes, true
}

// ChangedLen is the length of n bytes once changes are made to them.
func ChangedLen(n int, changes []Change) int {
	for _, c := range changes {
		n -= c.To - c.From
	}
	return n + Written(changes)
}

// Written is how many bytes the changes write.
func Written(changes []Change) int {
	n := 0
	for _, c := range changes {
		for _, s := range c.With {
			n += len(s)
		}
	}
	return n
}

// offsetIn is where b starts in buf, when b is a run of buf's memory.
func offsetIn(b, buf []byte) (int, bool) {
	if len(b) == 0 || len(buf) == 0 {
		return 0, false
	}
	start, base := uintptr(unsafe.Pointer(&b[0])), uintptr(unsafe.Pointer(&buf[0]))
	if start < base || start-base+uintptr(len(b)) > uintptr(len(buf)) {
		return 0, false
	}
	return int(start - base), true
}

// Len is the body's size in bytes.
func (b Body) Len() int { return b.n }

// Reader returns a new reader over the body; call it again to resend.
func (b Body) Reader() io.Reader { return &piecesReader{pieces: b.pieces} }

// piecesReader reads the pieces in turn. Unlike io.MultiReader it needs
// no copy buffer of its own: its WriteTo writes each piece as it is, and
// the transport calls it once more after the body, to find its end, where
// io.MultiReader allocated 32 KB each time.
type piecesReader struct {
	pieces []piece
	off    int // bytes of pieces[0] already read
}

func (r *piecesReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && len(r.pieces) > 0 {
		c := r.pieces[0]
		m := 0
		if c.b != nil {
			m = copy(p[n:], c.b[r.off:])
		} else {
			m = copy(p[n:], c.s[r.off:])
		}
		n += m
		if r.off += m; r.off == len(c.b)+len(c.s) {
			r.pieces, r.off = r.pieces[1:], 0
		}
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Rest hands over what is left to read, as buffers for one vectored
// write (net.Buffers), when it comes to at most max bytes; the reader is
// then at its end. The transport's connections take it
// (upstream.NewTransport), so a body of megabytes leaves in a few writev
// calls, not copied through a 32 KB buffer. The buffers alias the pieces,
// strings included: they are only read.
func (r *piecesReader) Rest(max int64) ([][]byte, bool) {
	var n int64
	for _, c := range r.pieces {
		n += int64(len(c.b) + len(c.s))
	}
	if n -= int64(r.off); n > max {
		return nil, false
	}
	bufs := make([][]byte, 0, len(r.pieces))
	for i, c := range r.pieces {
		b := c.b
		if b == nil {
			b = unsafe.Slice(unsafe.StringData(c.s), len(c.s))
		}
		if i == 0 {
			b = b[r.off:]
		}
		if len(b) > 0 {
			bufs = append(bufs, b)
		}
	}
	r.pieces, r.off = nil, 0
	return bufs, true
}

func (r *piecesReader) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for len(r.pieces) > 0 {
		c := r.pieces[0]
		var m int
		var err error
		if c.b != nil {
			m, err = w.Write(c.b[r.off:])
		} else {
			m, err = io.WriteString(w, c.s[r.off:])
		}
		n += int64(m)
		r.off += m
		if err != nil {
			return n, err
		}
		r.pieces, r.off = r.pieces[1:], 0
	}
	return n, nil
}

// Bytes assembles the body (for tests and small bodies).
func (b Body) Bytes() []byte {
	if len(b.pieces) == 1 && b.pieces[0].b != nil {
		return b.pieces[0].b
	}
	out := make([]byte, 0, b.n)
	for _, p := range b.pieces {
		out = append(out, p.s...)
		out = append(out, p.b...)
	}
	return out
}

// BodyWriter builds a Body: small writes gather in a buffer, and Big adds
// a large string as its own piece without copying it.
type BodyWriter struct {
	buf   []byte // what the writes added; its runs become pieces
	start int    // where the run not yet a piece begins
	body  Body
}

// bigPiece is the size from which a string becomes its own piece.
const bigPiece = 32 << 10

func (w *BodyWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *BodyWriter) WriteString(s string) (int, error) {
	w.buf = append(w.buf, s...)
	return len(s), nil
}

func (w *BodyWriter) WriteByte(c byte) error {
	w.buf = append(w.buf, c)
	return nil
}

// Big adds s as a piece of its own when it is large, else buffers it.
func (w *BodyWriter) Big(s string) {
	if len(s) < bigPiece {
		w.WriteString(s)
		return
	}
	w.flush()
	w.body.pieces = append(w.body.pieces, piece{s: s})
	w.body.n += len(s)
}

// Slice adds b as a piece of its own, not copied: the runs of a client's
// body between edits, which its buffer holds until the body is sent.
func (w *BodyWriter) Slice(b []byte) {
	if len(b) == 0 {
		return
	}
	w.flush()
	w.body.pieces = append(w.body.pieces, piece{b: b})
	w.body.n += len(b)
}

// flush makes the buffered run a piece. The piece's capacity ends with it,
// so later writes append past it or into a new array, never over it.
func (w *BodyWriter) flush() {
	if len(w.buf) > w.start {
		run := w.buf[w.start:len(w.buf):len(w.buf)]
		w.body.pieces = append(w.body.pieces, piece{b: run})
		w.body.n += len(run)
		w.start = len(w.buf)
	}
}

// Body returns what was written.
func (w *BodyWriter) Body() Body {
	w.flush()
	return w.body
}

// JSONWriter is what the codecs write requests into: a bytes.Buffer, or a
// BodyWriter that keeps large strings as pieces.
type JSONWriter interface {
	io.Writer
	io.StringWriter
	io.ByteWriter
}

// WriteObject writes o as a JSON object into w, the value of the field
// named key written by value straight into w (so its large strings stay
// pieces). A missing key is added at the end.
func WriteObject(w *BodyWriter, o Object, key string, value func(*BodyWriter) error) error {
	if _, ok := o.Get(key); !ok {
		o = append(o[:len(o):len(o)], Field{Key: key})
	}
	w.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			w.WriteByte(',')
		}
		k := Quote(f.Key) // as Object.MarshalJSON writes keys
		w.Write(k)
		w.WriteByte(':')
		if f.Key != key {
			w.Write(f.Value)
			continue
		}
		if err := value(w); err != nil {
			return err
		}
	}
	w.WriteByte('}')
	return nil
}
