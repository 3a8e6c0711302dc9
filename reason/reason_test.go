package reason

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
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
	// docs/design.md "Reason codes" lists them, in order: the design's 17,
	// and window pressure's own (window: the user's images are never under
	// the budget, so "budget" named their removal wrongly); every one is
	// valid, nothing else is.
	doc, err := os.ReadFile("../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "## Reason codes")
	section, _, _ = strings.Cut(section, "\n## ")
	var listed []Code
	for _, m := range regexp.MustCompile("`([a-z_]+)`\\s+\\(").FindAllStringSubmatch(section, -1) {
		listed = append(listed, Code(m[1]))
	}
	if !slices.Equal(listed, All) {
		t.Fatalf("docs/design.md lists %v; the code has %v", listed, All)
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
