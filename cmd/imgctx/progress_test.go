package main

import (
	"strings"
	"testing"
	"time"
)

// Off a terminal, a run shorter than a few seconds prints nothing; a
// longer one prints a line every few seconds and its last state.
func TestProgressOffATerminal(t *testing.T) {
	var out strings.Builder
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	p := &progress{w: &out, now: func() time.Time { return at }, start: at}
	for i := range 20 { // two seconds
		at = at.Add(100 * time.Millisecond)
		p.update("step %d", i+1)
	}
	p.done()
	if out.Len() != 0 {
		t.Fatalf("a 2-second run printed %q", out.String())
	}
	p = &progress{w: &out, now: func() time.Time { return at }, start: at}
	for i := range 140 { // fourteen seconds
		at = at.Add(100 * time.Millisecond)
		p.update("step %d", i+1)
	}
	p.done()
	if got, want := out.String(), "step 30\nstep 80\nstep 130\nstep 140\n"; got != want {
		t.Fatalf("a 14-second run printed %q; want %q", got, want)
	}
}
