package imagestore

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/imgctx/imgctx/blob"
)

// ErrQuota is wrapped by a Put refused because the tenant's share of the
// store is used up.
var ErrQuota = errors.New("tenant quota exceeded")

// Quota bounds what each tenant may keep in a store: bytes and images
// (0: no bound), so that one tenant cannot fill a volume the others share.
// A tenant's use is read once from the store (List) and then kept up to
// date by this process's Puts and Deletes: with several replicas each
// counts its own writes on top of what it read, so a tenant may pass its
// quota by what the others wrote since; the next start reads it again.
type Quota struct {
	Store
	MaxBytes  int64
	MaxImages int

	mu  sync.Mutex
	use map[string]*usage
}

type usage struct {
	bytes  int64
	images int
}

func (q *Quota) usage(ctx context.Context, tenant string) (*usage, error) {
	if u, ok := q.use[tenant]; ok {
		return u, nil
	}
	u := &usage{}
	if err := q.Store.List(ctx, tenant, func(in Info) error {
		u.bytes += in.Size
		u.images++
		return nil
	}); err != nil {
		return nil, err
	}
	if q.use == nil {
		q.use = map[string]*usage{}
	}
	q.use[tenant] = u
	return u, nil
}

// Put refuses, with ErrQuota and the bound it would pass, a new blob past
// the tenant's quota; a blob already stored (a re-send) only has its date
// refreshed.
func (q *Quota) Put(ctx context.Context, tenant string, ref blob.Ref, data []byte) error {
	if q.MaxBytes <= 0 && q.MaxImages <= 0 {
		return q.Store.Put(ctx, tenant, ref, data)
	}
	if _, err := q.Store.Stat(ctx, tenant, ref); err == nil {
		return q.Store.Put(ctx, tenant, ref, data)
	}
	// The share is reserved under the lock and the write made outside it:
	// tenants' writes are not serialised, and a failed write gives it back.
	n := int64(len(data))
	q.mu.Lock()
	u, err := q.usage(ctx, tenant)
	if err == nil {
		switch {
		case q.MaxBytes > 0 && u.bytes+n > q.MaxBytes:
			err = fmt.Errorf("%w: %d bytes stored and %d more would pass the limit of %d bytes (storage.tenant_max_bytes)", ErrQuota, u.bytes, n, q.MaxBytes)
		case q.MaxImages > 0 && u.images+1 > q.MaxImages:
			err = fmt.Errorf("%w: %d images stored, the limit (storage.tenant_max_images)", ErrQuota, q.MaxImages)
		default:
			u.bytes += n
			u.images++
		}
	}
	q.mu.Unlock()
	if err != nil {
		return err
	}
	if err := q.Store.Put(ctx, tenant, ref, data); err != nil {
		q.mu.Lock()
		u.bytes -= n
		u.images--
		q.mu.Unlock()
		return err
	}
	return nil
}

// Delete frees the blob's share of the tenant's quota.
func (q *Quota) Delete(ctx context.Context, tenant string, ref blob.Ref) error {
	in, statErr := q.Store.Stat(ctx, tenant, ref)
	if err := q.Store.Delete(ctx, tenant, ref); err != nil {
		return err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if u, ok := q.use[tenant]; ok && statErr == nil {
		u.bytes -= in.Size
		u.images--
	}
	return nil
}
