package reason

import (
	"errors"
	"fmt"
	"testing"
)

func TestOfFindsTheCodeThroughWrapping(t *testing.T) {
	base := New(TooLarge, "12 MB is over the limit")
	wrapped := fmt.Errorf("put image: %w", base)
	if got := Of(wrapped); got != TooLarge {
		t.Fatalf("got %q; want %q", got, TooLarge)
	}
	if got := Of(errors.New("plain")); got != "" {
		t.Fatalf("plain error carries code %q", got)
	}
	if got := Of(nil); got != "" {
		t.Fatalf("nil carries code %q", got)
	}
	cause := errors.New("unexpected EOF")
	w := Wrap(Invalid, "truncated header", cause)
	if !errors.Is(w, cause) || w.Error() != "invalid: truncated header: unexpected EOF" {
		t.Fatalf("wrap: %v", w)
	}
}

func TestCodesAreTheDesignVocabulary(t *testing.T) {
	// DESIGN.md "Reason codes" lists 17, and window pressure has its own
	// (window: the user's images are never under the budget, so "budget"
	// named their removal wrongly); every one is valid, nothing else is.
	if len(All) != 18 {
		t.Fatalf("%d codes; DESIGN.md's 17 and window", len(All))
	}
	seen := map[Code]bool{}
	for _, c := range All {
		if !c.Valid() || seen[c] {
			t.Fatalf("code %q invalid or repeated", c)
		}
		seen[c] = true
	}
	if Code("Budget").Valid() || Code("").Valid() {
		t.Fatal("unknown codes reported valid")
	}
}
