package wire

import (
	"encoding/json"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// intsTarget is a usage-shaped object for encoding/json: what Ints reads
// with intsKeys must be what json.Unmarshal reads into it.
type intsTarget struct {
	A int `json:"a"`
	B int `json:"b_b"`
	D *struct {
		C int `json:"c"`
	} `json:"d"`
}

var intsKeys = []string{"a", "b_b", "d.c"}

// checkInts fails when Ints says it read b and read it otherwise than
// json.Unmarshal does.
func checkInts(t interface{ Fatalf(string, ...any) }, b []byte) (read bool) {
	var got [3]int
	if !Ints(b, intsKeys, got[:]) {
		return false
	}
	var u intsTarget
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatalf("Ints read %s, which encoding/json refuses: %v", b, err)
	}
	want := [3]int{u.A, u.B, 0}
	if u.D != nil {
		want[2] = u.D.C
	}
	if got != want {
		t.Fatalf("Ints read %v from %s, encoding/json %v", got, b, want)
	}
	return true
}

// Ints reads a usage's numbers as encoding/json does, or says it cannot:
// keys in another case or escaped, duplicates, nulls, floats, strings,
// negatives, nested objects given as something else, and members it does
// not read.
func TestIntsReadsWhatEncodingJSONReads(t *testing.T) {
	key := rapid.SampledFrom([]string{"a", "A", "b_b", "B_b", `b\u005fb`, "d", "D", "c", "x", "usage"})
	num := rapid.SampledFrom([]string{"0", "7", "123456789", "-1", "1.5", "1e3", "01", `"5"`, "null", "true", "[1]", "99999999999999999999"})
	var value func(depth int) *rapid.Generator[string]
	value = func(depth int) *rapid.Generator[string] {
		if depth == 0 {
			return num
		}
		return rapid.OneOf(num, rapid.Custom(func(t *rapid.T) string {
			return object(t, key, value(depth-1))
		}))
	}
	read := 0
	rapid.Check(t, func(t *rapid.T) {
		b := object(t, key, value(2))
		if checkInts(t, []byte(b)) {
			read++
		}
	})
	if read == 0 {
		t.Fatal("no object was read by Ints: the property held vacuously")
	}
	// The shapes providers send are read, not handed to encoding/json.
	for _, b := range []string{`{"a":10,"b_b":1,"d":{"c":4}}`, `{ "a" : 10 , "x" : {"y":[1,"z"]}, "d" : { "c" : 0 } }`, `{"b_b":3,"d":{"c":1,"e":2}}`, `{}`} {
		if !checkInts(t, []byte(b)) {
			t.Errorf("Ints did not read %s", b)
		}
	}
}

func object(t *rapid.T, key, value *rapid.Generator[string]) string {
	var sb strings.Builder
	sb.WriteString("{")
	for i := range rapid.IntRange(0, 5).Draw(t, "members") {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`"` + key.Draw(t, "key") + `":` + rapid.SampledFrom([]string{"", " ", "\n"}).Draw(t, "space") + value.Draw(t, "value"))
	}
	sb.WriteString("}")
	return sb.String()
}

func FuzzInts(f *testing.F) {
	f.Add([]byte(`{"a":10,"b_b":1,"d":{"c":4}}`))
	f.Add([]byte(`{"A":1,"d":null,"a":2}`))
	f.Add([]byte(`{"d":{"c":1},"d":{"e":2}}`))
	f.Fuzz(func(t *testing.T, b []byte) { checkInts(t, b) })
}
