// Package wiretest helps codec tests: golden files refreshed with -update,
// and a readable dump of decoded values.
package wiretest

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
)

var update = flag.Bool("update", false, "rewrite golden files")

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
		switch wire.At(sp.Messages, s.Pos).(type) {
		case chat.Image, chat.Document:
		default:
			t.Fatalf("slot %d at %+v names no media part of the view", i, s.Pos)
		}
	}
	out, err := wire.Splice(sp.Body, nil)
	if err != nil || !bytes.Equal(out.Bytes(), sp.Body) {
		t.Fatalf("a splice without edits changed the body: %v", err)
	}
}

// FuzzScan fuzzes a wire's Scan: any body either is refused or scans to
// spans that hold together (CheckSpliced); the scan never panics.
func FuzzScan(f *testing.F, scan func([]byte, func(wire.Slot)) (*wire.Spliced, error)) {
	f.Fuzz(func(t *testing.T, b []byte) {
		if sp, err := scan(b, nil); err == nil {
			CheckSpliced(t, sp)
		}
	})
}
