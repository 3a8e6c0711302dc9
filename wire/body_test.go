package wire

import (
	"bytes"
	"io"
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
