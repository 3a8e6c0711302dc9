package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/imagestore/s3"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/postgres"
	"github.com/imgctx/imgctx/session/sqlite"
)

// imageBackend is the image store below its decorators, with what the
// maintenance commands need of it.
type imageBackend struct {
	raw     imagestore.Store // below encryption: tells sealed blobs from corrupt ones
	tenants func(context.Context) ([]string, error)
	// sweep removes what interrupted writes left, older than cutoff (S3
	// uploads are atomic and leave nothing).
	sweep func(cutoff time.Time) (int, error)
}

// openStore builds the image store stack from the config: the one place
// where the CLI chooses an image backend.
func (a *app) openStore(ctx context.Context) (imagestore.Store, imageBackend, error) {
	var key []byte
	if path := a.cfg.Store.EncryptKeyFile; path != "" {
		k, err := imagestore.ReadKeyFile(path)
		if err != nil {
			return nil, imageBackend{}, err
		}
		key = k
	}
	var b imageBackend
	switch a.cfg.Storage.Images {
	case "s3":
		c := a.cfg.Storage.S3
		st, err := s3.Open(ctx, s3.Config{Endpoint: c.Endpoint, Bucket: c.Bucket, Prefix: c.Prefix, Region: c.Region, AccessKey: c.AccessKey, SecretKey: c.SecretKey})
		if err != nil {
			return nil, imageBackend{}, err
		}
		b = imageBackend{raw: st, tenants: st.Tenants, sweep: func(time.Time) (int, error) { return 0, nil }}
	default:
		fsys, err := imagestore.NewFS(filepath.Join(a.cfg.DataDir, "images"))
		if err != nil {
			return nil, imageBackend{}, err
		}
		fsys.NoSync = a.cfg.Store.NoSync
		b = imageBackend{raw: fsys, tenants: func(context.Context) ([]string, error) { return fsys.Tenants() }, sweep: fsys.RemoveStaleTemps}
	}
	s, err := imagestore.Stack(b.raw, key)
	if err != nil {
		return nil, imageBackend{}, err
	}
	if st := a.cfg.Storage; st.TenantMaxBytes > 0 || st.TenantMaxImages > 0 {
		// Under the verification, so a Put is still hashed once.
		v := s.(imagestore.Verified)
		v.Store = &imagestore.Quota{Store: v.Store, MaxBytes: st.TenantMaxBytes, MaxImages: st.TenantMaxImages}
		s = v
	}
	return s, b, nil
}

// openExistingStore is openStore for commands that only read or clean:
// a mistyped --data-dir is an error, not a new empty store.
func (a *app) openExistingStore(ctx context.Context) (imagestore.Store, imageBackend, error) {
	if a.cfg.Storage.Images == "fs" {
		if _, err := os.Stat(filepath.Join(a.cfg.DataDir, "images")); err != nil {
			return nil, imageBackend{}, fmt.Errorf("no image store in %s (check --data-dir): %w", a.cfg.DataDir, err)
		}
	}
	return a.openStore(ctx)
}

// openSessions opens the configured session store, applying its
// migrations: the one place where the CLI chooses a session backend.
func (a *app) openSessions(ctx context.Context) (session.Store, error) {
	if a.cfg.Storage.Sessions == "postgres" {
		return postgres.Open(ctx, a.cfg.Storage.Postgres.DSN)
	}
	return sqlite.Open(filepath.Join(a.cfg.DataDir, "imgctx.db"))
}

// openExistingSessions is openSessions for commands that only read: with
// the embedded store and no database yet, there are no sessions (nil).
func (a *app) openExistingSessions(ctx context.Context) (session.Store, error) {
	if a.cfg.Storage.Sessions == "sqlite" {
		if _, err := os.Stat(filepath.Join(a.cfg.DataDir, "imgctx.db")); errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
	}
	return a.openSessions(ctx)
}
