package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/maphash"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/media"
)

// lifted is an image or document read from a request, checked, and not
// stored yet: a request's media are stored only once all are accepted.
type lifted struct {
	in        media.Info
	canonical bool   // the text is the standard encoding: it can go upstream as it came
	data      []byte // the decoded bytes to store; nil when stored already
	text      []byte // the base64 text, escapes undone (primes the encoding cache)
	key       *spanKey
}

// liftBase64 reads one inline base64 image or document: recognised by its
// span key when seen before (agents re-send the same image on every
// request), else decoded straight from the body — no copy of megabytes of
// text — and checked. Other forms than the standard encoding (URL-safe,
// unpadded, wrapped) are not canonical and go upstream re-encoded.
//
// b64 is a JSON string's contents as they stand in the body: JSON escapes
// ("\/") are undone only if decoding needs it. key, when not nil, is its
// span key computed already.
func (s *Server) liftBase64(ctx context.Context, tenant string, b64 []byte, declared string, key *spanKey) (lifted, error) {
	if key == nil {
		k := s.spanKeyOf(tenant, b64)
		key = &k
	}
	if seen, ok := s.seenSpan(ctx, *key); ok {
		return lifted{in: seen.info, canonical: seen.canonical, key: key}, nil
	}
	text := b64
	data, canonical, err := media.DecodeBase64Bytes(text)
	if err != nil && bytes.IndexByte(b64, '\\') >= 0 {
		var unescaped string
		if json.Unmarshal(append(append([]byte{'"'}, b64...), '"'), &unescaped) == nil {
			text = []byte(unescaped)
			data, canonical, err = media.DecodeBase64Bytes(text)
		}
	}
	if err != nil {
		return lifted{}, err
	}
	in, err := s.engine.Check(data, declared)
	if err != nil {
		return lifted{}, err
	}
	return lifted{in: in, canonical: canonical, data: data, text: text, key: key}, nil
}

// commit stores what a request lifted, once all of it was accepted, and
// remembers the spans for the next request.
func (s *Server) commit(ctx context.Context, tenant string, l lifted) error {
	if l.data == nil {
		return nil
	}
	if err := s.engine.Put(ctx, tenant, l.in, l.data); err != nil {
		return err
	}
	s.metrics.images.WithLabelValues("stored", "").Inc()
	s.metrics.imageBytes.WithLabelValues("stored").Add(float64(l.in.Bytes))
	if l.key == nil {
		return nil // a URL's image: no span to remember
	}
	if l.canonical {
		s.engine.PrimeBase64(l.in.Ref, string(l.text))
	}
	s.rememberSpan(*l.key, seenSpan{ref: l.in.Ref, canonical: l.canonical, info: l.in, touched: time.Now()})
	return nil
}

// seenSpan is what a base64 text seen before turned out to be, and when
// its blob was last touched in the store.
type seenSpan struct {
	ref       blob.Ref
	canonical bool
	info      media.Info
	touched   time.Time
}

// touchEvery is how often a re-sent image refreshes its blob's date (and
// so checks the blob is still there): an agent re-sends each screenshot on
// every request, and the store's GC counts in days.
const touchEvery = time.Minute

// spanKey names a base64 span cheaply: agents re-send the same image on
// every request, and hashing its text once is cheaper than decoding,
// hashing and storing it again. The key holds the tenant and the length;
// a hit is only used after Touch finds the blob in that tenant's store, so
// a collision can never reach another tenant's image.
type spanKey struct {
	tenant string
	n      int
	h      uint64
}

func (s *Server) spanKeyOf(tenant string, b64 []byte) spanKey {
	return spanKey{tenant, len(b64), maphash.Bytes(s.spanSeed, b64)}
}

func (s *Server) seenSpan(ctx context.Context, key spanKey) (seenSpan, bool) {
	s.mu.Lock()
	seen, ok := s.spans[key]
	s.mu.Unlock()
	if !ok {
		return seenSpan{}, false
	}
	if time.Since(seen.touched) < touchEvery {
		return seen, true
	}
	if s.engine.Images.Touch(ctx, key.tenant, seen.ref) != nil {
		return seenSpan{}, false // gone from the store: store it anew
	}
	seen.touched = time.Now()
	s.mu.Lock()
	s.spans[key] = seen
	s.mu.Unlock()
	return seen, true
}

func (s *Server) rememberSpan(key spanKey, seen seenSpan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.spans) >= 50_000 {
		clear(s.spans) // bounded: start over rather than grow
	}
	s.spans[key] = seen
}
