// Package wiretest helps codec tests: golden files refreshed with -update,
// and a readable dump of decoded values.
package wiretest

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

var update = flag.Bool("update", false, "rewrite golden files")

// Seed adds the files of a codec's testdata folder to a fuzz target's
// corpus; a file named and missing fails the target rather than shrink
// what it starts from unseen.
func Seed(f *testing.F, names ...string) {
	f.Helper()
	for _, n := range names {
		b, err := os.ReadFile("testdata/" + n)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// Golden compares got with the file at path, or rewrites the file when the
// test runs with -update.
func Golden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run the test with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs; got:\n%s\nwant:\n%s", path, got, want)
	}
}

// Dump renders v as indented JSON with a final newline, for golden files.
func Dump(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// CheckSpliced asserts what every scan of a body must give: the body is
// valid JSON outside the slots' sources (their base64 is checked by
// decoding, not by the scan), the slots' spans lie inside it in order without overlapping,
// each source inside its part, each slot's position names a part of the
// view of its kind, and a splice with no edits is the body itself.
func CheckSpliced(t testing.TB, sp *wire.Spliced) {
	t.Helper()
	var outside []byte
	last := 0
	for _, s := range sp.Slots {
		if s.Source.Start < last || s.Source.End > len(sp.Body) {
			t.Fatalf("slot source %+v out of order or outside the body", s.Source)
		}
		outside = append(append(outside, sp.Body[last:s.Source.Start]...), "null"...)
		last = s.Source.End
	}
	if outside = append(outside, sp.Body[last:]...); !json.Valid(outside) {
		t.Fatalf("a scan accepted invalid JSON: %q", sp.Body)
	}
	last = 0
	for i, s := range sp.Slots {
		if s.Part.Start < last || s.Part.End > len(sp.Body) || s.Source.Start < s.Part.Start || s.Source.End > s.Part.End || s.Source.Start > s.Source.End {
			t.Fatalf("slot %d spans %+v out of order or outside the body (len %d)", i, s, len(sp.Body))
		}
		last = s.Part.End
		// Of its own kind: the engine puts an image only where the view
		// holds one (chat.Message.ImagelessBefore).
		if got := wire.At(sp.Messages, s.Pos); got == nil || got.Kind() != s.Kind {
			t.Fatalf("slot %d, of kind %q, at %+v names no part of its kind in the view", i, s.Kind, s.Pos)
		}
	}
	// What the scan marked as holding no image holds none, seen from any
	// message on (chat.Imaged steps over it).
	for k := 0; k < len(sp.Messages); k += 1 + len(sp.Messages)/500 {
		var want []int
		for i, m := range sp.Messages[k:] {
			if chat.HasImage(m.Parts) {
				want = append(want, i)
			}
		}
		if got := chat.Imaged(sp.Messages[k:]); !slices.Equal(got, want) {
			t.Fatalf("from message %d, the messages holding an image are %v; the scan's marks say %v", k, want, got)
		}
	}
	out, err := wire.Splice(sp.Body, nil)
	if err != nil || !bytes.Equal(out.Bytes(), sp.Body) {
		t.Fatalf("a splice without edits changed the body: %v", err)
	}
}

// FuzzScan fuzzes a wire's Scan: any body either is refused or scans to
// spans that hold together (CheckSpliced); the scan never panics.
func FuzzScan(f *testing.F, scan func([]byte, wire.ScanOptions) (*wire.Spliced, error)) {
	f.Fuzz(func(t *testing.T, b []byte) {
		if sp, err := scan(b, wire.ScanOptions{}); err == nil {
			CheckSpliced(t, sp)
			CheckForwardable(t, b, sp)
		}
	})
}

// CheckForwardable asserts that a body a scan accepted is valid JSON but
// for its slots' base64, which ingestion decodes (and so refuses when it is
// not base64): the scan is as strict as json.Valid on every byte that goes
// upstream as it came.
func CheckForwardable(t *testing.T, b []byte, sp *wire.Spliced) {
	t.Helper()
	if json.Valid(b) {
		return
	}
	blank := append([]byte(nil), b...)
	for _, sl := range sp.Slots {
		if sl.Via == "base64" {
			for i := sl.Data.Start; i < sl.Data.End; i++ {
				blank[i] = 'A'
			}
		}
	}
	if !json.Valid(blank) {
		t.Fatalf("the scan accepted invalid JSON outside its slots' base64: %.200q", b)
	}
}

// CheckResume asserts that a scan resumed from an earlier scan's Resume
// gives exactly what a full scan gives: for the body cut to its first k
// messages (an earlier request of the same conversation) for every k, and
// for the body with one byte changed in each message in turn.
func CheckResume(t *testing.T, scan func([]byte, wire.ScanOptions) (*wire.Spliced, error), body []byte) {
	t.Helper()
	full, err := scan(body, wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var arr wire.Span
	for _, list := range []string{"messages", "input", "contents"} { // Chat and Messages, Responses, Gemini
		if sp, ok := full.Top[list]; ok {
			arr = sp
		}
	}
	same := func(what string, b []byte, prev *wire.Resume) {
		t.Helper()
		want, err1 := scan(b, wire.ScanOptions{})
		got, err2 := scan(b, wire.ScanOptions{Prev: prev})
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("%s: full scan %v, resumed %v", what, err1, err2)
		}
		if err1 != nil {
			return
		}
		CheckSpliced(t, got)
		if !reflect.DeepEqual(want.Messages, got.Messages) || !reflect.DeepEqual(want.Slots, got.Slots) || got.Resumed > len(got.Marks) ||
			!reflect.DeepEqual(want.Marks, got.Marks) || !reflect.DeepEqual(want.Top, got.Top) || want.End != got.End {
			t.Fatalf("%s: a resumed scan differs from a full one", what)
		}
	}
	for k := 0; k < len(full.Marks); k++ {
		// The earlier request: messages before k, then the rest of the body.
		cut := bytes.TrimRight(body[:full.Marks[k].Start], " \t\r\n,")
		if k == 0 {
			cut = body[:arr.Start+1]
		}
		earlier := append(append(append([]byte(nil), cut...), ']'), body[arr.End:]...)
		prev, err := scan(earlier, wire.ScanOptions{})
		if err != nil {
			t.Fatalf("the body cut to %d messages: %v", k, err)
		}
		what := fmt.Sprintf("after %d of %d messages", k, len(full.Marks))
		same(what, body, prev.Resume())
		if got, _ := scan(body, wire.ScanOptions{Prev: prev.Resume()}); got.Resumed != k {
			t.Fatalf("%s: took over %d messages; want %d", what, got.Resumed, k)
		}
	}
	for k, m := range full.Marks {
		changed := append([]byte(nil), body...)
		for i := m.Start; i < len(changed); i++ {
			if c := changed[i]; c >= 'a' && c <= 'y' {
				changed[i]++ // a letter somewhere in message k (or later)
				break
			}
		}
		same(fmt.Sprintf("message %d changed", k), changed, full.Resume())
	}
}

// FuzzResume fuzzes a resumed scan: for any two bodies, scanning the second
// with the first's Resume gives what a full scan of the second gives.
func FuzzResume(f *testing.F, scan func([]byte, wire.ScanOptions) (*wire.Spliced, error)) {
	f.Fuzz(func(t *testing.T, earlier, body []byte) {
		prev, err := scan(earlier, wire.ScanOptions{})
		if err != nil {
			return
		}
		want, err1 := scan(body, wire.ScanOptions{})
		got, err2 := scan(body, wire.ScanOptions{Prev: prev.Resume()})
		if (err1 == nil) != (err2 == nil) {
			t.Fatalf("full scan %v, resumed %v", err1, err2)
		}
		if err1 == nil && (!reflect.DeepEqual(want.Messages, got.Messages) || !reflect.DeepEqual(want.Slots, got.Slots) ||
			!reflect.DeepEqual(want.Marks, got.Marks) || !reflect.DeepEqual(want.Top, got.Top) || want.End != got.End) {
			t.Fatalf("a resumed scan differs from a full one")
		}
	})
}

// View is what a scan golden pins: each message's role and its parts'
// kinds (a nested part prefixed "+"), and each slot's kind, form, media
// type, detail, URL, place and the start of its part's bytes.
func View(sp *wire.Spliced) any {
	var v struct {
		Messages []string
		Slots    []string
	}
	for _, m := range sp.Messages {
		var kinds []string
		chat.Walk(m.Parts, func(p chat.Part, depth int) bool {
			kinds = append(kinds, strings.Repeat("+", depth)+p.Kind())
			return true
		})
		v.Messages = append(v.Messages, string(m.Role)+": "+strings.Join(kinds, " "))
	}
	for _, s := range sp.Slots {
		pos, _ := json.Marshal(s.Pos)
		v.Slots = append(v.Slots, strings.Join([]string{s.Kind, s.Via, s.MediaType, s.Detail, s.URL, string(pos),
			string(sp.Body[s.Part.Start:min(s.Part.End, s.Part.Start+40)])}, " | "))
	}
	return v
}

// ReadFile reads a test file or fails the test.
func ReadFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Stream feeds the server-sent events of the file at path to a new reader
// of d, and returns what the gateway reads of them: usage, cut, done.
func Stream(t testing.TB, d *wire.Dialect, path string) map[string]any {
	t.Helper()
	r := d.NewStream()
	sr := wire.NewSSEReader(bytes.NewReader(ReadFile(t, path)))
	for {
		ev, err := sr.Next()
		if err != nil {
			break
		}
		r.Add(ev, false)
	}
	u, cut, done := r.Result()
	return map[string]any{"usage": u, "cut": cut, "done": done}
}
