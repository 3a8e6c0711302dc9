package engine

import (
	"path/filepath"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
)

func openSessions(dir string) (session.Store, error) {
	return sqlite.Open(filepath.Join(dir, "imgctx.db"))
}
