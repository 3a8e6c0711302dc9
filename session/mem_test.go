package session_test

import (
	"testing"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sessiontest"
)

func TestConformanceMem(t *testing.T) {
	sessiontest.Run(t, sessiontest.Harness{New: func(*testing.T) session.Store { return &session.Mem{} }})
}
