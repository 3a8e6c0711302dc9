package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/session/sqlite"
	"github.com/imgctx/imgctx/upstream"
)

// store gc deletes at the provider the files no conversation used within
// proxy.idle_expiry, with the configured key, and forgets them; a file of
// a key it does not hold (a client's own) is left and said so; a file in
// use stays.
func TestStoreGCDeletesProviderFiles(t *testing.T) {
	var mu sync.Mutex
	var deleted []string
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete || !strings.HasPrefix(r.URL.Path, "/v1/files/") || r.Header.Get("X-Api-Key") != "sk-configured" ||
			r.Header.Get("Anthropic-Beta") == "" {
			http.Error(w, `{"type":"error","error":{"type":"not_found_error","message":"no"}}`, 404)
			return
		}
		mu.Lock()
		deleted = append(deleted, strings.TrimPrefix(r.URL.Path, "/v1/files/"))
		mu.Unlock()
		fmt.Fprint(w, `{"id":"x","type":"file_deleted"}`)
	}))
	defer provider.Close()
	dir := t.TempDir()
	if r := imgctx(t, "store", "put", sample, "--data-dir", dir); r.code != 0 {
		t.Fatalf("put: %s", r.stderr)
	}
	db, err := sqlite.Open(filepath.Join(dir, "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	client := &upstream.Client{Format: upstream.Anthropic, BaseURL: provider.URL, APIKey: "sk-configured"}
	configured := client.Fingerprint(client.Credential(upstream.Request{}))
	old, now := time.Now().Add(-3*time.Hour), time.Now()
	file := func(id, cred string, used time.Time) session.ProviderFile {
		return session.ProviderFile{FileKey: session.FileKey{Upstream: provider.URL, Credential: cred, Wire: "anthropic", Ref: blob.Of([]byte(id))},
			ID: id, Uploaded: used, Used: used}
	}
	for _, f := range []session.ProviderFile{file("file_stale", configured, old), file("file_clients", "0123456789abcdef", old), file("file_live", configured, now)} {
		if err := db.SaveFile(t.Context(), f); err != nil {
			t.Fatal(err)
		}
	}
	db.Close()
	cfg := writeTemp(t, "c.yaml", fmt.Appendf(nil, "proxy:\n  idle_expiry: 1h\nupstreams:\n  - name: claude\n    format: anthropic\n    base_url: %s\n    api_key: sk-configured\n    file_ids: auto\n", provider.URL))
	r := imgctx(t, "store", "gc", "--data-dir", dir, "--config", cfg)
	if r.code != 0 || !strings.Contains(r.stdout, "deleted 1 provider file(s)") || !strings.Contains(r.stdout, "1 left") {
		t.Fatalf("gc: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if len(deleted) != 1 || deleted[0] != "file_stale" {
		t.Fatalf("deleted at the provider: %v", deleted)
	}
	db, err = sqlite.Open(filepath.Join(dir, "imgctx.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for id, want := range map[string]bool{"file_stale": false, "file_clients": true, "file_live": true} {
		cred := configured
		if id == "file_clients" {
			cred = "0123456789abcdef"
		}
		_, err := db.LoadFile(t.Context(), file(id, cred, now).FileKey)
		if (err == nil) != want {
			t.Errorf("%s: still listed %v, want %v (%v)", id, err == nil, want, err)
		}
	}
}
