// Command imgctx is the image-aware context engine's command line: estimate
// what images cost a model, manage the image store, list model profiles.
//
// Exit codes: 0 success, 1 failure, 2 usage error.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/reason"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run executes one command line and returns its exit code; tests call it.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(args)
	root.SetIn(stdin)
	err := root.Execute()
	if err == nil {
		return 0
	}
	fmt.Fprintf(stderr, "imgctx: %v\n", err)
	if isUsage(err) {
		err = usageError{err}
	}
	if h := hint(err); h != "" {
		fmt.Fprintf(stderr, "hint: %s\n", h)
	}
	if isUsage(err) {
		return 2
	}
	return 1
}

// isUsage reports errors of a wrongly formed command line, including
// cobra's own for unknown commands.
func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command")
}

// usageError marks a wrongly formed command line (exit code 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// hint suggests a next step for the errors people hit.
func hint(err error) string {
	var u usageError
	switch {
	case errors.As(err, &u):
		return "run 'imgctx help' or add --help to the command"
	case reason.Of(err) == reason.Invalid:
		return "accepted formats are PNG, JPEG, GIF, WebP (images) and PDF (documents)"
	case reason.Of(err) == reason.TooLarge:
		return "shrink the image, or raise media.max_image_bytes / media.max_pixels (docs/config.md)"
	case errors.Is(err, imagestore.ErrNotFound):
		return "check the ref, the --data-dir and the --tenant"
	case errors.Is(err, imagestore.ErrCorrupt):
		return "run 'imgctx store verify'; put the image again to repair it"
	case errors.Is(err, imagestore.ErrUnknownKey):
		return "the store is encrypted: pass the key it was written with (--encrypt-key-file); do not put the images again without it, that would store them in plaintext"
	}
	return ""
}
