package blob

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestOfAndParseRoundTrip(t *testing.T) {
	r := Of([]byte("hello"))
	// Known SHA-256 of "hello".
	want := "sha256-2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
	if got := r.String(); got != want {
		t.Fatalf("got %s; want %s", got, want)
	}
	p, err := Parse(want)
	if err != nil {
		t.Fatal(err)
	}
	if p != r {
		t.Fatalf("parsed ref %v differs from computed %v", p, r)
	}
	if !r.Matches([]byte("hello")) || r.Matches([]byte("hellO")) {
		t.Fatal("Matches disagrees with the digest")
	}
}

func TestParseRefusals(t *testing.T) {
	good := Of([]byte("x")).Hex()
	cases := []struct {
		name, in, want string
	}{
		{"wrong prefix", "sha1-" + good, "does not start with"},
		{"no prefix", good, "does not start with"},
		{"short", Prefix + good[:63], "63 characters"},
		{"long", Prefix + good + "0", "65 characters"},
		{"upper case", Prefix + strings.ToUpper(good[:2]) + good[2:], "lower case"},
		{"non hex", Prefix + "g" + good[1:], "non-hex"},
		{"empty", "", "does not start with"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.in)
			if !errors.Is(err, ErrInvalidRef) {
				t.Fatalf("got %v; want ErrInvalidRef", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %q; want it to mention %q", err, c.want)
			}
		})
	}
}

func TestRefIsAMapKeyAndJSON(t *testing.T) {
	a, b := Of([]byte("a")), Of([]byte("a"))
	m := map[Ref]int{a: 1}
	m[b]++
	if len(m) != 1 || m[a] != 2 {
		t.Fatalf("equal refs are not one map key: %v", m)
	}
	if (Ref{}).Valid() || (Ref{}).String() != "" {
		t.Fatal("zero Ref must be invalid and print empty")
	}
	js, err := json.Marshal(struct{ R Ref }{a})
	if err != nil {
		t.Fatal(err)
	}
	var back struct{ R Ref }
	if err := json.Unmarshal(js, &back); err != nil || back.R != a {
		t.Fatalf("JSON round trip: %s -> %v, %v", js, back.R, err)
	}
	if err := json.Unmarshal([]byte(`{"R":"sha256-XYZ"}`), &back); err == nil {
		t.Fatal("bad ref accepted from JSON")
	}
}
