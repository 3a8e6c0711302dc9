package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/term"
)

// progress rewrites one status line on a terminal, at most ten times a
// second; elsewhere (pipes, CI logs) it prints nothing.
type progress struct {
	w    io.Writer
	tty  bool
	last time.Time
	line string
}

func newProgress(w io.Writer) *progress {
	f, ok := w.(*os.File)
	return &progress{w: w, tty: ok && term.IsTerminal(int(f.Fd()))}
}

func (p *progress) update(format string, args ...any) {
	if !p.tty {
		return
	}
	p.line = fmt.Sprintf(format, args...)
	if time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	fmt.Fprintf(p.w, "\r\033[K%s", p.line)
}

// done prints the final state and ends the line.
func (p *progress) done() {
	if p.tty && p.line != "" {
		fmt.Fprintf(p.w, "\r\033[K%s\n", p.line)
		p.line = ""
	}
}
