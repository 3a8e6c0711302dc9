package imagestore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/imgctx/imgctx/blob"
)

// Mem is an in-memory Store for tests and ephemeral setups. The zero value is
// ready to use.
type Mem struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu    sync.Mutex
	blobs map[string]map[blob.Ref]memBlob
}

type memBlob struct {
	data []byte
	mod  time.Time
}

var _ Store = (*Mem)(nil)

func (m *Mem) now() time.Time {
	if m.Now != nil {
		return m.Now()
	}
	return time.Now()
}

// Put stores a copy of data.
func (m *Mem) Put(_ context.Context, tenant string, ref blob.Ref, data []byte) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.blobs == nil {
		m.blobs = map[string]map[blob.Ref]memBlob{}
	}
	if m.blobs[tenant] == nil {
		m.blobs[tenant] = map[blob.Ref]memBlob{}
	}
	m.blobs[tenant][ref] = memBlob{data: slices.Clone(data), mod: m.now()}
	return nil
}

func (m *Mem) lookup(tenant string, ref blob.Ref) (memBlob, error) {
	if err := CheckArgs(tenant, ref); err != nil {
		return memBlob{}, err
	}
	b, ok := m.blobs[tenant][ref]
	if !ok {
		return memBlob{}, fmt.Errorf("%s: %w", ref, ErrNotFound)
	}
	return b, nil
}

// Get returns a copy of the bytes under ref.
func (m *Mem) Get(_ context.Context, tenant string, ref blob.Ref) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.lookup(tenant, ref)
	if err != nil {
		return nil, err
	}
	return slices.Clone(b.data), nil
}

// Stat describes the blob under ref.
func (m *Mem) Stat(_ context.Context, tenant string, ref blob.Ref) (Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.lookup(tenant, ref)
	if err != nil {
		return Info{}, err
	}
	return Info{Ref: ref, Size: int64(len(b.data)), ModTime: b.mod}, nil
}

// Touch refreshes the date of the blob under ref.
func (m *Mem) Touch(_ context.Context, tenant string, ref blob.Ref) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, err := m.lookup(tenant, ref)
	if err != nil {
		return err
	}
	b.mod = m.now()
	m.blobs[tenant][ref] = b
	return nil
}

// Delete removes the blob under ref.
func (m *Mem) Delete(_ context.Context, tenant string, ref blob.Ref) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.blobs[tenant], ref)
	return nil
}

// List calls fn for each blob of tenant in ref order. fn runs without the
// lock held, so it may call back into the store.
func (m *Mem) List(ctx context.Context, tenant string, fn func(Info) error) error {
	if err := ValidTenant(tenant); err != nil {
		return err
	}
	m.mu.Lock()
	infos := make([]Info, 0, len(m.blobs[tenant]))
	for ref, b := range m.blobs[tenant] {
		infos = append(infos, Info{Ref: ref, Size: int64(len(b.data)), ModTime: b.mod})
	}
	m.mu.Unlock()
	slices.SortFunc(infos, func(a, b Info) int { return compareRefs(a.Ref, b.Ref) })
	for _, in := range infos {
		if err := fn(in); err != nil {
			return err
		}
	}
	return ctx.Err()
}

func compareRefs(a, b blob.Ref) int {
	da, db := a.Digest(), b.Digest()
	return slices.Compare(da[:], db[:])
}
