package imagestore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	. "github.com/imgctx/imgctx/imagestore"
)

// Issue "Hardening, third pass", item 8: one tenant's share is bounded in
// bytes and images; a re-send of a stored image is always accepted; a
// delete frees its share; another tenant keeps its own share.
func TestQuotaBoundsEachTenant(t *testing.T) {
	ctx := context.Background()
	mem := &Mem{}
	Put(ctx, mem, "acme", []byte("stored before the quota was read")) // counted from List
	q := &Quota{Store: mem, MaxBytes: 100, MaxImages: 3}
	a := []byte(strings.Repeat("a", 40))
	if _, err := Put(ctx, q, "acme", a); err != nil {
		t.Fatal(err)
	}
	if _, err := Put(ctx, q, "acme", a); err != nil {
		t.Fatalf("a re-send was refused: %v", err)
	}
	_, err := Put(ctx, q, "acme", []byte(strings.Repeat("b", 40)))
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "storage.tenant_max_bytes") {
		t.Fatalf("72 + 40 bytes past 100: %v", err)
	}
	if _, err := Put(ctx, q, "other", []byte(strings.Repeat("b", 40))); err != nil {
		t.Fatalf("another tenant's share: %v", err)
	}
	if err := q.Delete(ctx, "acme", blob.Of(a)); err != nil {
		t.Fatal(err)
	}
	if _, err := Put(ctx, q, "acme", []byte(strings.Repeat("b", 40))); err != nil {
		t.Fatalf("after a delete freed 40 bytes: %v", err)
	}
	for i := range 3 { // the second and third fit; the fourth does not
		_, err = Put(ctx, q, "other", []byte{byte(i)})
	}
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "storage.tenant_max_images") {
		t.Fatalf("a fourth image past 3: %v", err)
	}
}
