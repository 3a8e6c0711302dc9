package imagestore

import (
	"context"
	"fmt"

	"github.com/imgctx/imgctx/blob"
)

// Verified is the outermost decorator of a store stack: it refuses a Put
// whose bytes do not hash to the ref, and checks the hash again on every Get,
// so a caller never receives bytes that are not the image it named.
type Verified struct {
	Store
}

var _ Store = Verified{}

// Put stores data after checking that it hashes to ref.
func (v Verified) Put(ctx context.Context, tenant string, ref blob.Ref, data []byte) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	if !ref.Matches(data) {
		return fmt.Errorf("put %s: %w", ref, ErrRefMismatch)
	}
	return v.Store.Put(ctx, tenant, ref, data)
}

// Get returns the bytes under ref after checking that they hash to it.
func (v Verified) Get(ctx context.Context, tenant string, ref blob.Ref) ([]byte, error) {
	data, err := v.Store.Get(ctx, tenant, ref)
	if err != nil {
		return nil, err
	}
	if !ref.Matches(data) {
		return nil, fmt.Errorf("get %s: %w: content hash differs", ref, ErrCorrupt)
	}
	return data, nil
}
