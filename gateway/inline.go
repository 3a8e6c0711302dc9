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

// liftBase64 stores one inline base64 image or document (or recognises
// it: agents re-send the same image on every request) and returns what it
// is. It is decoded straight from the body, with no copy of megabytes of
// text; when that text is the canonical encoding, it is also what the
// upstream gets for the ref, without encoding it again.
//
// canonical says whether b64 is the standard encoding of the bytes, which
// can go upstream as it came; other forms (URL-safe, unpadded, wrapped)
// are sent in the standard encoding.
//
// b64 is a JSON string's contents as they stand in the body: JSON escapes
// ("\/") are undone only if decoding needs it. key, when not nil, is its
// span key computed already.
func (s *Server) liftBase64(ctx context.Context, tenant string, b64 []byte, declared string, key *spanKey) (in media.Info, canonical bool, err error) {
	k := s.spanKeyOf(tenant, b64)
	if key != nil {
		k = *key
	}
	if seen, ok := s.seenSpan(ctx, k); ok {
		return seen.info, seen.canonical, nil
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
		return media.Info{}, false, err
	}
	in, err = s.engine.StoreBytes(ctx, tenant, data, declared)
	if err != nil {
		return media.Info{}, false, err
	}
	if canonical {
		s.engine.PrimeBase64(in.Ref, string(text))
	}
	s.rememberSpan(k, seenSpan{ref: in.Ref, canonical: canonical, info: in, touched: time.Now()})
	s.metrics.images.WithLabelValues("stored", "").Inc()
	s.metrics.imageBytes.WithLabelValues("stored").Add(float64(in.Bytes))
	return in, canonical, nil
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
