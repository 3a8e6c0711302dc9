package session

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
)

// Mem is an in-memory Store, for tests and throwaway gateways. It keeps
// what it is given as encoded JSON, as a database would, so callers never
// share memory with it.
type Mem struct {
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu       sync.Mutex
	sessions map[string]map[ID]*memSession
	proxied  map[string]memProxied // by tenant + "/" + key
	recalls  map[[2]string]Recall  // by tenant, handle
	requests []memRequest          // oldest first
	files    map[FileKey]ProviderFile
}

type memRequest struct {
	at   time.Time
	line []byte // EncodeRequest's
}

type memProxied struct {
	state   []byte
	updated time.Time
}

type memSession struct {
	meta    Meta
	entries []memEntry
	state   []byte
}

type memEntry struct {
	seq  int64
	at   time.Time
	body []byte
}

var _ Store = (*Mem)(nil)

func (m *Mem) now() time.Time {
	if m.Now != nil {
		return m.Now().UTC()
	}
	return time.Now().UTC()
}

func (m *Mem) lookup(tenant string, id ID) (*memSession, error) {
	if s := m.sessions[tenant][id]; s != nil {
		return s, nil
	}
	return nil, fmt.Errorf("%s: %w", id, ErrNotFound)
}

func (m *Mem) Create(_ context.Context, meta Meta) (Meta, error) {
	if err := imagestore.ValidTenant(meta.Tenant); err != nil {
		return Meta{}, err
	}
	if meta.ID == "" {
		meta.ID = NewID()
	}
	state, _ := EncodeState(State{})
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sessions == nil {
		m.sessions = map[string]map[ID]*memSession{}
	}
	if m.sessions[meta.Tenant] == nil {
		m.sessions[meta.Tenant] = map[ID]*memSession{}
	}
	if m.sessions[meta.Tenant][meta.ID] != nil {
		return Meta{}, fmt.Errorf("session %s already exists", meta.ID)
	}
	meta.Created = m.now()
	meta.Updated = meta.Created
	m.sessions[meta.Tenant][meta.ID] = &memSession{meta: meta, state: state}
	return meta, nil
}

func (m *Mem) Load(_ context.Context, tenant string, id ID) (Snapshot, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Snapshot{}, err
	}
	snap := Snapshot{Meta: s.meta}
	for _, e := range s.entries {
		entry, err := DecodeEntry(e.seq, e.at, e.body)
		if err != nil {
			return Snapshot{}, err
		}
		snap.Log = append(snap.Log, entry)
	}
	snap.State, err = DecodeState(s.state)
	return snap, err
}

func (m *Mem) LoadState(_ context.Context, tenant string, id ID, known int64) (Current, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Current{}, err
	}
	return DecodeCurrent(s.meta, int64(len(s.entries)), known, string(s.state), nil)
}

func (m *Mem) Append(_ context.Context, tenant string, id ID, entries []Entry, st State) ([]Entry, error) {
	state, err := EncodeState(st)
	if err != nil {
		return nil, err
	}
	encoded := make([][]byte, len(entries))
	for i, e := range entries {
		if _, encoded[i], err = EncodeEntry(e); err != nil {
			return nil, err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookup(tenant, id)
	if err != nil {
		return nil, err
	}
	now := m.now()
	out := slices.Clone(entries)
	for i := range out {
		out[i].Seq, out[i].At = int64(len(s.entries))+1, now
		s.entries = append(s.entries, memEntry{out[i].Seq, now, encoded[i]})
	}
	s.state, s.meta.Updated = state, now
	return out, nil
}

func (m *Mem) SetSettings(_ context.Context, tenant string, id ID, st chat.Settings) (Meta, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, err := m.lookup(tenant, id)
	if err != nil {
		return Meta{}, err
	}
	s.meta.Settings, s.meta.Updated = st, m.now()
	return s.meta, nil
}

func (m *Mem) List(_ context.Context, tenant string) ([]Meta, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Meta
	for _, s := range m.sessions[tenant] {
		out = append(out, s.meta)
	}
	slices.SortFunc(out, func(a, b Meta) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return compareIDs(a.ID, b.ID)
	})
	return out, nil
}

func compareIDs(a, b ID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func (m *Mem) Delete(_ context.Context, tenant string, id ID) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := m.lookup(tenant, id); err != nil {
		return err
	}
	delete(m.sessions[tenant], id)
	return nil
}

func (m *Mem) LoadProxied(_ context.Context, tenant, key string) (Proxied, error) {
	m.mu.Lock()
	p, ok := m.proxied[tenant+"/"+key]
	m.mu.Unlock()
	if !ok {
		return Proxied{}, fmt.Errorf("proxied %s: %w", key, ErrNotFound)
	}
	return DecodeProxied(p.state)
}

func (m *Mem) SaveProxied(_ context.Context, tenant, key string, p Proxied) error {
	b, err := EncodeProxied(p)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proxied == nil {
		m.proxied = map[string]memProxied{}
	}
	m.proxied[tenant+"/"+key] = memProxied{b, m.now()}
	return nil
}

func (m *Mem) ExpireProxied(_ context.Context, idleBefore time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for k, p := range m.proxied {
		if p.updated.Before(idleBefore) {
			delete(m.proxied, k)
			n++
		}
	}
	for k, r := range m.recalls {
		if _, live := m.proxied[k[0]+"/"+r.Conversation]; !live && r.Removed.Before(idleBefore) {
			delete(m.recalls, k)
		}
	}
	return n, nil
}

func (m *Mem) ActiveProxied(_ context.Context, since time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, p := range m.proxied {
		if !p.updated.Before(since) {
			n++
		}
	}
	return n, nil
}

func (m *Mem) SaveRecalls(_ context.Context, tenant string, rs []Recall) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.recalls == nil {
		m.recalls = map[[2]string]Recall{}
	}
	for _, r := range rs {
		if _, ok := m.recalls[[2]string{tenant, r.Handle}]; !ok {
			r.Removed = time.Unix(0, r.Removed.UnixNano()).UTC()
			m.recalls[[2]string{tenant, r.Handle}] = r
		}
	}
	return nil
}

func (m *Mem) LoadRecall(_ context.Context, tenant, handle string) (Recall, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recalls[[2]string{tenant, handle}]
	if !ok {
		return Recall{}, fmt.Errorf("recall %q: %w", handle, ErrNotFound)
	}
	return r, nil
}

func (m *Mem) ListRecalls(_ context.Context, tenant, conversation string) ([]Recall, error) {
	m.mu.Lock()
	var out []Recall
	for k, r := range m.recalls {
		if k[0] == tenant && r.Conversation == conversation {
			out = append(out, r)
		}
	}
	m.mu.Unlock()
	sortRecalls(out)
	return out[:min(len(out), MaxRecallList)], nil
}

func (m *Mem) AppendRequests(_ context.Context, rs []Request) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range rs {
		b, err := EncodeRequest(r)
		if err != nil {
			return err
		}
		m.requests = append(m.requests, memRequest{at: r.Time, line: b})
	}
	return nil
}

func (m *Mem) ListRequests(_ context.Context, f RequestFilter) ([]Request, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Request
	for i := len(m.requests) - 1; i >= 0 && len(out) < f.Limited(); i-- {
		r, err := DecodeRequest(m.requests[i].line)
		if err != nil {
			return nil, err
		}
		if f.Matches(r) {
			out = append(out, r)
		}
	}
	return out, nil
}

func (m *Mem) SumRequests(_ context.Context, tenant string, since time.Time) ([]Totals, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	by := map[[2]string]*Totals{}
	var out []*Totals
	for _, mr := range m.requests {
		r, err := DecodeRequest(mr.line)
		if err != nil {
			return nil, err
		}
		if r.Tenant != tenant || r.Time.Before(since) {
			continue
		}
		hour := r.Time.UTC().Truncate(time.Hour)
		k := [2]string{r.Model, hour.Format(time.RFC3339)}
		if by[k] == nil {
			by[k] = &Totals{Model: r.Model, Hour: hour}
			out = append(out, by[k])
		}
		by[k].Add(r)
	}
	slices.SortFunc(out, func(a, b *Totals) int {
		if c := a.Hour.Compare(b.Hour); c != 0 {
			return c
		}
		return strings.Compare(a.Model, b.Model)
	})
	totals := make([]Totals, len(out))
	for i, t := range out {
		totals[i] = *t
	}
	return totals, nil
}

func (m *Mem) TrimRequests(_ context.Context, before time.Time, keep int) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.requests = slices.DeleteFunc(m.requests, func(r memRequest) bool { return r.at.Before(before) })
	if keep > 0 && len(m.requests) > keep {
		m.requests = slices.Delete(m.requests, 0, len(m.requests)-keep)
	}
	return len(m.requests), nil
}

func (m *Mem) Close() error { return nil }

// Ping always succeeds: memory is there.
func (m *Mem) Ping(context.Context) error { return nil }

func (m *Mem) LoadFile(_ context.Context, k FileKey) (ProviderFile, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f, ok := m.files[k]
	if !ok {
		return ProviderFile{}, fmt.Errorf("provider file: %w", ErrNotFound)
	}
	return f, nil
}

func (m *Mem) SaveFile(_ context.Context, f ProviderFile) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.files == nil {
		m.files = map[FileKey]ProviderFile{}
	}
	f.Expires, f.Uploaded, f.Used = f.Expires.UTC(), f.Uploaded.UTC(), f.Used.UTC()
	m.files[f.FileKey] = f
	return nil
}

func (m *Mem) DeleteFile(_ context.Context, k FileKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.files, k)
	return nil
}

func (m *Mem) StaleFiles(_ context.Context, usedBefore time.Time) ([]ProviderFile, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ProviderFile
	for _, f := range m.files {
		if f.Used.Before(usedBefore) || !f.Expires.IsZero() && f.Expires.Before(usedBefore) {
			out = append(out, f)
		}
	}
	sortStale(out)
	return out[:min(len(out), MaxStaleFiles)], nil
}
