package jsonspan

import (
	"encoding/json"
	"strings"
	"testing"
)

var samples = []string{
	`{}`, `[]`, `""`, `0`, `-0.5e+10`, `true`, `false`, `null`,
	`{"a":1,"b":[1,2,{"c":"d"}],"e":{"f":null}}`,
	"{\n  \"model\" : \"x\",\n  \"messages\" : [ { \"role\" : \"user\" } ]\n}\n",
	`"\u00e9\n\"\\\/"`, `{"\u0074ype":"image"}`,
	`"` + strings.Repeat("QUJD", 1000) + `"`,
	// invalid
	`{`, `[1,]`, `{"a"}`, `{"a":}`, `01`, `1.`, `1e`, `-`, `tru`, `"abc`, "\"a\x01b\"", `"\x"`, `"\u12"`,
	`{"a":1,}`, `[1 2]`, `{"a" 1}`, `{1:2}`, `"` + strings.Repeat("A", 20) + "\x1f" + `"`,
}

// The scan accepts exactly what encoding/json accepts.
func TestValidAgreesWithEncodingJSON(t *testing.T) {
	for _, s := range samples {
		if got, want := valid([]byte(s)), json.Valid([]byte(s)); got != want {
			t.Errorf("valid(%q) = %v; want %v", s, got, want)
		}
	}
}

func TestObjectGivesMembersAsSpans(t *testing.T) {
	b := []byte("{ \"model\" : \"m\" ,\n \"n\":[1, 2] , \"\\u0074ype\":{\"x\":true} }")
	var keys, vals []string
	end, err := Object(b, 0, func(key []byte, vs int) (int, error) {
		ve, err := End(b, vs)
		keys = append(keys, string(key))
		vals = append(vals, string(b[vs:ve]))
		return ve, err
	})
	if err != nil || end != len(b) {
		t.Fatalf("end %d err %v; want %d, nil", end, err, len(b))
	}
	if strings.Join(keys, ",") != "model,n,type" || strings.Join(vals, "|") != `"m"|[1, 2]|{"x":true}` {
		t.Errorf("got keys %q vals %q", keys, vals)
	}
}

func TestArrayGivesElementsAsSpans(t *testing.T) {
	b := []byte(`[ {"a":1} , "s" ,3 ]`)
	var els []string
	if _, err := Array(b, 0, func(vs int) (int, error) {
		ve, err := End(b, vs)
		els = append(els, string(b[vs:ve]))
		return ve, err
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(els, "|") != `{"a":1}|"s"|3` {
		t.Errorf("got %q", els)
	}
}

func TestStringDecodesEscapesOnlyWhenPresent(t *testing.T) {
	b := []byte(`"plain" "a\u00e9\n"`)
	if s, ok := String(b, 0, 7); !ok || s != "plain" {
		t.Errorf("got %q %v", s, ok)
	}
	if s, ok := String(b, 8, len(b)); !ok || s != "aé\n" {
		t.Errorf("got %q %v", s, ok)
	}
}

// Regression: nesting is bounded, so a body of a million '[' is refused
// rather than overflowing the stack.
func TestDeepNestingIsRefused(t *testing.T) {
	b := []byte(strings.Repeat("[", maxDepth+5) + strings.Repeat("]", maxDepth+5))
	if valid(b) {
		t.Fatal("accepted nesting deeper than the limit")
	}
}

func FuzzValid(f *testing.F) {
	for _, s := range samples {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		// Nesting past maxDepth is the one documented difference.
		if strings.Count(string(b), "[")+strings.Count(string(b), "{") >= maxDepth {
			return
		}
		if got, want := valid(b), json.Valid(b); got != want {
			t.Fatalf("valid(%q) = %v; encoding/json says %v", b, got, want)
		}
	})
}

// valid reports whether b is exactly one JSON value, with optional
// whitespace around it: the scanner's validation, as End runs it.
func valid(b []byte) bool {
	end, err := End(b, Skip(b, 0))
	return err == nil && Skip(b, end) == len(b)
}
