package wire

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestObjectKeepsOrderAndBytes(t *testing.T) {
	in := []byte(`{"model":"gpt-4o","temperature":0.70,"messages":[{"role":"user","content":"hi"}],"x-custom":{"a":[1, 2]}}`)
	o, err := ParseObject(in)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := o.MarshalJSON()
	if !bytes.Equal(in, out) {
		t.Fatalf("round trip changed bytes:\n%s\n%s", in, out)
	}
	o.Set("temperature", []byte(`0.1`))
	o.Set("new", []byte(`true`))
	o.Delete("x-custom")
	out, _ = o.MarshalJSON()
	if string(out) != `{"model":"gpt-4o","temperature":0.1,"messages":[{"role":"user","content":"hi"}],"new":true}` {
		t.Fatalf("got %s", out)
	}
	for _, bad := range []string{`[]`, `{"a":1} {"b":2}`, `{"a":`, `"x"`} {
		if _, err := ParseObject([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
}

func TestSSEReaderKeepsRawEvents(t *testing.T) {
	stream := "event: message_start\ndata: {\"a\":1}\n\n: comment\ndata: line1\ndata: line2\n\n\ndata: [DONE]\n\n"
	r := NewSSEReader(strings.NewReader(stream))
	var got []Event
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if len(got) != 3 || got[0].Name != "message_start" || string(got[0].Data) != `{"a":1}` ||
		string(got[1].Data) != "line1\nline2" || string(got[2].Data) != "[DONE]" {
		t.Fatalf("events %+v", got)
	}
	var joined []byte
	for _, ev := range got {
		joined = append(joined, ev.Raw...)
	}
	if string(joined) != strings.Replace(stream, "\n\n\ndata: [DONE]", "\n\ndata: [DONE]", 1) {
		t.Fatalf("raw bytes differ:\n%q", joined)
	}
}

// An event longer than the reader's buffer — a streamed image, a large
// tool call — comes whole, its raw bytes as sent, and the stream goes on
// after it; one past MaxEventBytes is an error, not a stall or a cut.
func TestSSEReaderLongEvents(t *testing.T) {
	big := `{"inlineData":{"data":"` + strings.Repeat("QUJD", 50_000) + `"}}` // 200 KB on one line
	stream := "event: chunk\r\ndata: " + big + "\r\ndata: " + big + "\r\n\r\ndata: [DONE]\n\n"
	r := NewSSEReader(strings.NewReader(stream))
	ev, err := r.Next()
	if err != nil || ev.Name != "chunk" || string(ev.Data) != big+"\n"+big || string(ev.Raw) != stream[:len(stream)-len("data: [DONE]\n\n")] {
		t.Fatalf("the long event: %v, name %q, %d data bytes, %d raw", err, ev.Name, len(ev.Data), len(ev.Raw))
	}
	if ev, err := r.Next(); err != nil || string(ev.Data) != "[DONE]" {
		t.Fatalf("the event after it: %q, %v", ev.Data, err)
	}
	for _, over := range []string{
		"data: " + strings.Repeat("x", MaxEventBytes+1) + "\n\n",                      // one line
		strings.Repeat("data: "+strings.Repeat("x", 1<<20)+"\n", MaxEventBytes>>20+1), // many
	} {
		if _, err := NewSSEReader(strings.NewReader(over)).Next(); err != io.ErrShortBuffer {
			t.Fatalf("an event of %d bytes: %v, want io.ErrShortBuffer", len(over), err)
		}
	}
}

func TestRetryAfterAndKinds(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("Retry-After", "2")
	if got := RetryAfter(h, now); got != 2*time.Second {
		t.Fatalf("seconds: %v", got)
	}
	h.Set("Retry-After", now.Add(30*time.Second).Format(http.TimeFormat))
	if got := RetryAfter(h, now); got != 30*time.Second {
		t.Fatalf("date: %v", got)
	}
	for status, want := range map[int]Kind{401: Auth, 403: Auth, 413: RequestTooLarge, 429: RateLimited, 529: Overloaded, 500: Server, 400: BadRequest, 404: BadRequest} {
		if got := KindForStatus(status); got != want {
			t.Errorf("%d: %s; want %s", status, got, want)
		}
	}
}

func TestWriteStringEscapesOnlyWhenNeeded(t *testing.T) {
	for _, s := range []string{"data:image/png;base64,iVBORw0KGgo=", "", "a", strings.Repeat("A+/=", 100) + "xyz",
		"quote\"inside", "back\\slash", "tab\there", "ünïcode", strings.Repeat("abcdefg", 3) + "\x01", strings.Repeat("x", 15) + "\""} {
		var b bytes.Buffer
		WriteString(&b, s)
		var back string
		if err := json.Unmarshal(b.Bytes(), &back); err != nil || back != s {
			t.Fatalf("%q → %s → %q, %v", s, b.Bytes(), back, err)
		}
	}
}

func TestBodyKeepsBigStringsAsPieces(t *testing.T) {
	big := strings.Repeat("QUJD", 20000) // 80 KB: its own piece
	var w BodyWriter
	w.WriteString(`{"url":`)
	WriteString(&w, big)
	w.WriteByte('}')
	b := w.Body()
	want := `{"url":"` + big + `"}`
	if b.Len() != len(want) || string(b.Bytes()) != want || len(b.pieces) != 3 || b.pieces[1].s != big {
		t.Fatalf("len %d, %d pieces", b.Len(), len(b.pieces))
	}
	for range 2 { // a retry reads it again
		got, _ := io.ReadAll(b.Reader())
		if string(got) != want {
			t.Fatal("reader differs")
		}
	}
	raw := []byte("assembled")
	if ob := BodyOf(raw); &ob.Bytes()[0] != &raw[0] {
		t.Fatal("BodyOf copied its bytes")
	}
}

// A data URL is written in pieces, the base64 as is; an odd media type is
// still escaped.
func TestWriteDataURL(t *testing.T) {
	big := strings.Repeat("QUJD", 20000)
	for _, mt := range []string{"image/png", `image/"png"`} {
		var w BodyWriter
		WriteDataURL(&w, mt, big)
		b := w.Body()
		var back string
		if err := json.Unmarshal(b.Bytes(), &back); err != nil || back != "data:"+mt+";base64,"+big {
			t.Fatalf("%q: %.60s… does not read back: %v", mt, b.Bytes(), err)
		}
		if len(b.pieces) != 3 || b.pieces[1].s != big {
			t.Fatalf("%q: the base64 was copied into %d pieces", mt, len(b.pieces))
		}
	}
	var w BodyWriter
	WriteBase64(&w, big)
	if b := w.Body(); string(b.Bytes()) != `"`+big+`"` || len(b.pieces) != 3 || b.pieces[1].s != big {
		t.Fatalf("WriteBase64: %d pieces", len(b.pieces))
	}
}

// WriteObject keeps the fields in order, writes the named one through its
// function, adds it at the end when missing, and passes its error on.
func TestWriteObject(t *testing.T) {
	o, _ := ParseObject([]byte(`{"model":"m","messages":[1],"x":{"y":2}}`))
	msgs := func(w *BodyWriter) error { w.WriteString(`["new"]`); return nil }
	for _, c := range []struct {
		in   Object
		want string
	}{
		{o, `{"model":"m","messages":["new"],"x":{"y":2}}`},
		{o[:1], `{"model":"m","messages":["new"]}`},
	} {
		var w BodyWriter
		if err := WriteObject(&w, c.in, "messages", msgs); err != nil || string(w.Body().Bytes()) != c.want {
			t.Fatalf("got %s, %v; want %s", w.Body().Bytes(), err, c.want)
		}
	}
	if len(o) != 3 || string(o[1].Value) != "[1]" {
		t.Fatal("WriteObject changed its object")
	}
	var w BodyWriter
	if err := WriteObject(&w, o, "messages", func(*BodyWriter) error { return io.ErrUnexpectedEOF }); err != io.ErrUnexpectedEOF {
		t.Fatalf("error not passed on: %v", err)
	}
}
