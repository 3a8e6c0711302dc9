package wire

import (
	"bytes"
	"slices"

	"github.com/imgctx/imgctx/chat"
)

// Memo keeps the encoding of each turn of a session's request for the
// next request, which re-sends the same history with a little appended:
// a turn whose messages are the same (chat.Equal) and written the same
// way (key: a breakpoint, its lifetime) is copied, not encoded again.
// Turns with images or documents are always written anew (their data is
// large, and the engine's encoding cache holds it already). A nil Memo
// keeps nothing. Not safe for concurrent use: one session's turns hold it.
// The messages written are held, their parts not copied: the caller never
// changes a message in place (a session's live context copies one it
// changes), and the next request's same messages, sharing their parts,
// compare at the cost of their pointers.
type Memo struct {
	// prev and next are the turns of the last request and of this one,
	// in the order they are written (by their first message, rising);
	// seen is how far this request has looked in prev. Slices, not maps:
	// a long session's request then allocates nothing to remember its
	// turns.
	prev, next []memoTurn
	seen       int
}

type memoTurn struct {
	at   int // the turn's first message
	msgs []chat.Message
	key  string
	b    []byte
}

// Write writes the turn msgs, the request's messages from at on, with
// encode — or as the previous request wrote the same turn.
func (m *Memo) Write(w JSONWriter, at int, msgs []chat.Message, key string, encode func(JSONWriter) error) error {
	if m == nil || hasMedia(msgs) {
		return encode(w)
	}
	if n := len(m.next); n > 0 && m.next[n-1].at >= at {
		// Turns are written in order: this one starts another request
		// (the one before failed, its turns not Done).
		m.next, m.seen = m.next[:0], 0
	}
	for m.seen < len(m.prev) && m.prev[m.seen].at < at {
		m.seen++
	}
	if m.seen < len(m.prev) {
		if t := m.prev[m.seen]; t.at == at && t.key == key && sameMessages(t.msgs, msgs) {
			m.next = append(m.next, t)
			return writeKept(w, t.b)
		}
	}
	var b bytes.Buffer
	if err := encode(&b); err != nil {
		return err
	}
	m.next = append(m.next, memoTurn{at: at, msgs: slices.Clone(msgs), key: key, b: b.Bytes()})
	return writeKept(w, b.Bytes())
}

// writeKept writes a turn's bytes, which the memo never changes: into a
// BodyWriter as a piece of its own, not copied — a long session's body is
// then its turns side by side, gathered once at the end, not a buffer
// that doubles as they are appended.
func writeKept(w JSONWriter, b []byte) error {
	if bw, ok := w.(*BodyWriter); ok {
		bw.Slice(b)
		return nil
	}
	_, err := w.Write(b)
	return err
}

// Done ends a request: what it wrote is what the next one may copy.
func (m *Memo) Done() {
	if m != nil {
		clear(m.prev) // what it held goes with the request before
		m.prev, m.next, m.seen = m.next, m.prev[:0], 0
	}
}

func sameMessages(a, b []chat.Message) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !chat.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

func hasMedia(msgs []chat.Message) bool {
	found := false
	for _, m := range msgs {
		chat.Walk(m.Parts, func(p chat.Part, _ int) bool {
			switch p.(type) {
			case chat.Image, chat.Document:
				found = true
			}
			return !found
		})
	}
	return found
}
