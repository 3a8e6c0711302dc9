package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/term"
)

// progress reports long work on stderr: on a terminal it rewrites one
// status line, at most ten times a second; elsewhere (pipes, CI logs) a
// run that lasts more than a few seconds prints a plain line every few
// seconds, and its last state at the end.
type progress struct {
	w       io.Writer
	tty     bool
	now     func() time.Time
	start   time.Time
	last    time.Time
	line    string
	printed bool // a plain line was printed (not a terminal)
}

// Plain lines start after quietFor and come at most every plainEvery.
const quietFor, plainEvery = 3 * time.Second, 5 * time.Second

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && term.IsTerminal(int(f.Fd())), now: time.Now, start: time.Now()}
}

func (p *progress) update(format string, args ...any) {
	p.line = fmt.Sprintf(format, args...)
	now := p.now()
	if p.tty {
		if now.Sub(p.last) < 100*time.Millisecond {
			return
		}
		p.last = now
		fmt.Fprintf(p.w, "\r\033[K%s", p.line)
		return
	}
	if now.Sub(p.start) < quietFor || now.Sub(p.last) < plainEvery {
		return
	}
	p.last, p.printed = now, true
	fmt.Fprintln(p.w, p.line)
}

// done prints the final state and ends the line.
func (p *progress) done() {
	switch {
	case p.tty && p.line != "":
		fmt.Fprintf(p.w, "\r\033[K%s\n", p.line)
	case !p.tty && p.printed:
		fmt.Fprintln(p.w, p.line)
	}
	p.line = ""
}
