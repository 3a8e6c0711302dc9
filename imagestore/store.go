// Package imagestore keeps image and document bytes by content address,
// scoped by tenant. Backends (FS, Mem) store exactly the bytes they are given
// under a ref and detect their own corruption; decorators add meaning on top:
// Encrypted seals bytes at rest, Verified enforces that what is stored under a
// ref hashes to it. Build the usual stack with Open.
//
// Every implementation passes the conformance suite in imagestore/storetest.
package imagestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/imgctx/imgctx/blob"
)

// Sentinel errors callers branch on with errors.Is.
var (
	ErrNotFound      = errors.New("image not found")
	ErrCorrupt       = errors.New("stored image is corrupt")
	ErrRefMismatch   = errors.New("bytes do not match their ref")
	ErrInvalidTenant = errors.New("invalid tenant")
	ErrInvalidRef    = errors.New("invalid ref")
)

// Info describes one stored blob.
type Info struct {
	Ref     blob.Ref
	Size    int64     // bytes a Get returns
	ModTime time.Time // last Put or Touch
}

// Store keeps blobs by ref, per tenant. A tenant never sees another tenant's
// blobs: asking for one answers ErrNotFound, exactly like a missing ref.
//
// All methods are safe for concurrent use. Puts of the same ref may race;
// each leaves a complete blob and the last one wins. No method ever returns
// partial or wrong bytes: corruption is ErrCorrupt.
type Store interface {
	// Put stores data under ref for tenant, durably, and refreshes its date
	// when it is already there. The store does not keep a reference to data.
	Put(ctx context.Context, tenant string, ref blob.Ref, data []byte) error
	// Get returns the bytes stored under ref; ErrNotFound when absent.
	Get(ctx context.Context, tenant string, ref blob.Ref) ([]byte, error)
	// Stat describes the blob under ref without reading it; ErrNotFound when absent.
	Stat(ctx context.Context, tenant string, ref blob.Ref) (Info, error)
	// Touch refreshes the date of the blob under ref; ErrNotFound when absent.
	Touch(ctx context.Context, tenant string, ref blob.Ref) error
	// Delete removes the blob under ref; deleting a missing ref is not an error.
	Delete(ctx context.Context, tenant string, ref blob.Ref) error
	// List calls fn for every blob of tenant in ref order, stopping at the
	// first error fn returns (which List returns).
	List(ctx context.Context, tenant string, fn func(Info) error) error
}

// DefaultTenant is the tenant of single-user setups and the CLI.
const DefaultTenant = "default"

// ValidTenant checks that a tenant name is 1 to 64 characters of
// [A-Za-z0-9._-], not starting with a dot, so it is safe as a directory name.
func ValidTenant(t string) error {
	if len(t) == 0 || len(t) > 64 || t[0] == '.' {
		return fmt.Errorf("%w: %q", ErrInvalidTenant, t)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%w: %q", ErrInvalidTenant, t)
		}
	}
	return nil
}

// CheckArgs refuses an invalid tenant or ref, as every backend does first.
func CheckArgs(tenant string, ref blob.Ref) error {
	if err := ValidTenant(tenant); err != nil {
		return err
	}
	if !ref.Valid() {
		return ErrInvalidRef
	}
	return nil
}

// PutComputed stores data under ref, which the caller has just computed
// from data with blob.Of: a Verified store skips its own hash check, so a
// 1 MB image is hashed once, not twice.
func PutComputed(ctx context.Context, s Store, tenant string, ref blob.Ref, data []byte) error {
	if v, ok := s.(Verified); ok {
		if err := CheckArgs(tenant, ref); err != nil {
			return err
		}
		s = v.Store
	}
	return s.Put(ctx, tenant, ref, data)
}

// GCStats reports what a GC did.
type GCStats struct {
	Scanned int
	Removed int
	Freed   int64
	Kept    int // old enough, but still referenced
}

// GC deletes the blobs of tenant not touched since before cutoff, except
// those keep names (refs something still uses: a session's live context).
// progress, when not nil, is called after each blob with the running
// stats. A blob touched between the scan and its deletion is kept.
func GC(ctx context.Context, s Store, tenant string, cutoff time.Time, keep map[blob.Ref]bool, progress func(GCStats)) (GCStats, error) {
	var st GCStats
	var old []Info
	err := s.List(ctx, tenant, func(in Info) error {
		st.Scanned++
		switch {
		case !in.ModTime.Before(cutoff):
		case keep[in.Ref]:
			st.Kept++
		default:
			old = append(old, in)
		}
		return ctx.Err()
	})
	if err != nil {
		return st, err
	}
	for _, in := range old {
		if err := ctx.Err(); err != nil {
			return st, err
		}
		// Re-check right before deleting: a Put or Touch since the scan wins.
		cur, err := s.Stat(ctx, tenant, in.Ref)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return st, err
		}
		if !cur.ModTime.Before(cutoff) {
			continue
		}
		if err := s.Delete(ctx, tenant, in.Ref); err != nil {
			return st, err
		}
		st.Removed++
		st.Freed += cur.Size
		if progress != nil {
			progress(st)
		}
	}
	return st, nil
}

// VerifyStats reports what a Verify found.
type VerifyStats struct {
	Checked int
	Corrupt []blob.Ref
	// Sealed are blobs encrypted at rest that this store cannot open: no
	// key was given (they look sealed), or their key version is unknown.
	// They are not corrupt; putting them again without the key would
	// overwrite them with plaintext.
	Sealed []blob.Ref
}

func sealedBelow(ctx context.Context, raw Store, tenant string, ref blob.Ref) bool {
	data, err := raw.Get(ctx, tenant, ref)
	return err == nil && LooksSealed(data)
}

// LooksSealed reports whether stored bytes look like a sealed blob rather
// than an image or document: long enough, and none of their formats' magic.
func LooksSealed(data []byte) bool {
	if len(data) < sealOverhead || data[0] == 0 {
		return false
	}
	for _, magic := range []string{"\x89PNG", "\xFF\xD8\xFF", "GIF8", "RIFF", "%PDF"} {
		if bytes.HasPrefix(data, []byte(magic)) {
			return false
		}
	}
	return true
}

// Verify reads back every blob of tenant, collecting the refs that fail,
// and goes on to the end. raw, when not nil, is the store below any
// encryption, read when s was opened without a key: a blob that fails there
// because it is sealed is reported as Sealed, not corrupt. progress, when
// not nil, is called after each blob.
func Verify(ctx context.Context, s Store, tenant string, raw Store, progress func(VerifyStats)) (VerifyStats, error) {
	var st VerifyStats
	err := s.List(ctx, tenant, func(in Info) error {
		if _, err := s.Get(ctx, tenant, in.Ref); err != nil {
			switch {
			case errors.Is(err, ErrUnknownKey):
				st.Sealed = append(st.Sealed, in.Ref)
			case !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrRefMismatch):
				return err
			case raw != nil && sealedBelow(ctx, raw, tenant, in.Ref):
				st.Sealed = append(st.Sealed, in.Ref)
			default:
				st.Corrupt = append(st.Corrupt, in.Ref)
			}
		}
		st.Checked++
		if progress != nil {
			progress(st)
		}
		return ctx.Err()
	})
	return st, err
}
