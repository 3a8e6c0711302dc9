package sqlite

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sessiontest"
)

func TestConformanceSQLite(t *testing.T) {
	var path string
	open := func(t *testing.T) session.Store {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	sessiontest.Run(t, sessiontest.Harness{
		New: func(t *testing.T) session.Store {
			path = filepath.Join(t.TempDir(), "imgctx.db")
			return open(t)
		},
		Reopen: open,
	})
}

func TestMigrationsApplyOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "imgctx.db")
	for range 2 {
		s, err := Open(path)
		if err != nil {
			t.Fatal(err)
		}
		var n int
		files, _ := fs.Glob(migrations, "migrations/*.sql")
		if err := s.db.QueryRow(`SELECT COUNT(*) FROM schema_migrations`).Scan(&n); err != nil || n != len(files) || n < 2 {
			t.Fatalf("%d migrations recorded, %v", n, err)
		}
		var mode string
		s.db.QueryRow(`PRAGMA journal_mode`).Scan(&mode)
		if mode != "wal" {
			t.Fatalf("journal mode %q; want wal", mode)
		}
		s.Close()
	}
}

// Regression (issue "Hardening", item 9): the database was created 0644
// while images are 0600.
func TestDatabaseIsOwnerOnly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "imgctx.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", fi.Mode().Perm(), err)
	}
}
