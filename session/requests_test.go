package session_test

import (
	"fmt"
	"testing"

	"github.com/imgctx/imgctx/session"
)

// A request's view is rebuilt from its conversation's lines: each line's
// outline replaces the messages from its OutlineFrom on; a line that
// starts past what is known says the view is incomplete.
func TestViewRebuildsTheOutline(t *testing.T) {
	f := func(role string, n int) session.Folded { return session.Folded{Role: role, Bytes: n} }
	lines := []session.Request{
		{Outline: []session.Folded{f("user", 10)}},
		{OutlineFrom: 1, Outline: []session.Folded{f("assistant", 20), f("user", 30)}},
		{OutlineFrom: 0, Outline: []session.Folded{f("user", 5), f("assistant", 6)}}, // the client compacted
		{OutlineFrom: 2, Outline: []session.Folded{f("user", 7)}},
	}
	for at, want := range []string{"user10", "user10 assistant20 user30", "user5 assistant6", "user5 assistant6 user7"} {
		view, ok := session.View(lines, at)
		got := ""
		for i, m := range view {
			if i > 0 {
				got += " "
			}
			got += fmt.Sprintf("%s%d", m.Role, m.Bytes)
		}
		if !ok || got != want {
			t.Errorf("view at %d: %q (complete %v), want %q", at, got, ok, want)
		}
	}
	if _, ok := session.View(lines[3:], 0); ok {
		t.Error("a view whose first lines are gone should say it is incomplete")
	}
}
