package wire

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// However a body's pieces are read — reads of any size, then the rest
// handed over (Rest) or written out — what comes out is the body, once,
// and the reader ends.
func TestBodyReadsAsItsBytes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var w BodyWriter
		for _, kind := range rapid.SliceOfN(rapid.IntRange(0, 3), 0, 12).Draw(t, "kinds") {
			text := rapid.StringN(0, 40, -1).Draw(t, "text")
			switch kind {
			case 0:
				w.WriteString(text)
			case 1:
				w.Slice([]byte(text))
			case 2:
				w.Big(string(bytes.Repeat([]byte(text+"x"), bigPiece)))
			case 3:
				w.WriteByte('!')
			}
		}
		b := w.Body()
		want := b.Bytes()
		if len(want) != b.Len() {
			t.Fatalf("Len %d, %d bytes", b.Len(), len(want))
		}
		r := b.Reader()
		var got bytes.Buffer
		for range rapid.IntRange(0, 5).Draw(t, "reads") {
			p := make([]byte, rapid.IntRange(0, 70000).Draw(t, "size"))
			n, err := r.Read(p)
			got.Write(p[:n])
			if err == io.EOF && got.Len() != len(want) {
				t.Fatalf("EOF after %d of %d bytes", got.Len(), len(want))
			}
		}
		rest := len(want) - got.Len()
		if max := rapid.IntRange(0, rest+2).Draw(t, "max"); max < rest {
			// Over the limit: Rest takes nothing, the reader reads on.
			if _, ok := r.(*piecesReader).Rest(int64(max)); ok {
				t.Fatalf("Rest(%d) took %d bytes", max, rest)
			}
		} else {
			bufs, ok := r.(*piecesReader).Rest(int64(max))
			if !ok {
				t.Fatalf("Rest(%d) refused %d bytes", max, rest)
			}
			got.Write(bytes.Join(bufs, nil))
		}
		if _, err := io.Copy(&got, r); err != nil { // WriteTo where the reader has it
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Fatalf("read %d bytes, want %d", got.Len(), len(want))
		}
		if n, err := io.Copy(io.Discard, r); n != 0 || err != nil { // the transport's check for more
			t.Fatalf("after the end: %d bytes, %v", n, err)
		}
	})
}

// Splice sends the client's runs between edits as they are — pieces of
// its body, not copies — and what it writes lands between them, even
// when a later write grows the buffer the earlier ones were in.
func TestSpliceKeepsTheClientsRunsInPlace(t *testing.T) {
	body := []byte(`{"a":1,"b":2,"c":3}`)
	var edits []Edit
	for _, at := range []int{5, 11, 17} {
		edits = append(edits, Edit{Start: at, End: at + 1, Write: func(w *BodyWriter) {
			w.WriteString(string(bytes.Repeat([]byte("9"), at))) // grows the buffer past what the earlier pieces saw
		}})
	}
	b, err := Splice(body, edits)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"a":99999,"b":99999999999,"c":99999999999999999}`
	if got := string(b.Bytes()); got != want {
		t.Fatalf("%s, want %s", got, want)
	}
	if &b.pieces[0].b[0] != &body[0] {
		t.Fatal("the client's first run was copied")
	}
}

// applied is buf with changes made, for the tests.
func applied(buf []byte, changes []Change) []byte {
	var out []byte
	at := 0
	for _, c := range changes {
		out = append(out, buf[at:c.From]...)
		for _, s := range c.With {
			out = append(out, s...)
		}
		at = c.To
	}
	return append(out, buf[at:]...)
}

// A body spliced from a buffer is told by its changes to that buffer:
// made to the buffer they give the body, twice the same splice gives the
// same changes, and a body that is the buffer as it is has none.
func TestBodyChangesRemakeTheBody(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		buf := []byte(rapid.StringN(1, 300, -1).Draw(t, "buf"))
		var edits []Edit
		for at := 0; at <= len(buf); {
			from := rapid.IntRange(at, len(buf)).Draw(t, "from")
			to := rapid.IntRange(from, min(len(buf), from+20)).Draw(t, "to")
			text := rapid.StringN(0, 10, -1).Draw(t, "with")
			big := rapid.Bool().Draw(t, "big")
			edits = append(edits, Edit{Start: from, End: to, Write: func(w *BodyWriter) {
				if big {
					w.Big(strings.Repeat(text+"x", bigPiece))
				} else {
					w.WriteString(text)
				}
			}})
			if at = to + rapid.IntRange(0, 40).Draw(t, "gap"); rapid.Bool().Draw(t, "last") {
				break
			}
		}
		body, err := Splice(buf, slices.Clone(edits))
		if err != nil {
			t.Fatal(err)
		}
		changes, ok := body.Changes(buf, 1<<20)
		if !ok {
			t.Fatal("a spliced body has no changes")
		}
		if got := applied(buf, changes); !bytes.Equal(got, body.Bytes()) {
			t.Fatalf("the changes make %q, the body is %q", got, body.Bytes())
		}
		if n := ChangedLen(len(buf), changes); n != body.Len() {
			t.Fatalf("ChangedLen %d, the body has %d bytes", n, body.Len())
		}
		again, _ := Splice(buf, slices.Clone(edits))
		twice, _ := again.Changes(buf, 1<<20)
		if !slices.EqualFunc(changes, twice, Change.Equal) {
			t.Fatalf("the same splice gives other changes: %v, then %v", changes, twice)
		}
	})
	buf := []byte(`{"messages":[1,2,3]}`)
	if ch, ok := BodyOf(buf).Changes(buf, 0); !ok || len(ch) != 0 {
		t.Fatalf("the buffer as it is: %v, %v", ch, ok)
	}
	if _, ok := BodyOf(bytes.Clone(buf)).Changes(buf, 4); ok {
		t.Fatal("a copy of the buffer was taken for changes past the copy bound")
	}
	if ch, ok := BodyOf(bytes.Clone(buf)).Changes(buf, 1<<10); !ok || len(ch) != 1 || ch[0].From != 0 || ch[0].To != len(buf) {
		t.Fatalf("a copy of the buffer: %v, %v, want one change of the whole", ch, ok)
	}
	var w BodyWriter
	w.Slice(buf[10:])
	w.Slice(buf[:10])
	if _, ok := w.Body().Changes(buf, 1<<10); ok {
		t.Fatal("runs out of order were told as changes")
	}
}
