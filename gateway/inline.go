package gateway

import (
	"context"
	"hash/maphash"

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
func (s *Server) liftBase64(ctx context.Context, tenant string, b64 []byte, declared string) (in media.Info, canonical bool, err error) {
	if seen, ok := s.seenSpan(ctx, tenant, b64); ok {
		in, err := s.engine.Lookup(ctx, tenant, seen.ref)
		return in, seen.canonical, err
	}
	data, canonical, err := media.DecodeBase64Bytes(b64)
	if err != nil {
		return media.Info{}, false, err
	}
	in, err = s.engine.StoreBytes(ctx, tenant, data, declared)
	if err != nil {
		return media.Info{}, false, err
	}
	if canonical {
		s.engine.PrimeBase64(in.Ref, string(b64))
	}
	s.rememberSpan(tenant, b64, seenSpan{in.Ref, canonical})
	s.metrics.images.WithLabelValues("stored", "").Inc()
	s.metrics.imageBytes.WithLabelValues("stored").Add(float64(in.Bytes))
	return in, canonical, nil
}

// seenSpan is what a base64 text seen before turned out to be.
type seenSpan struct {
	ref       blob.Ref
	canonical bool
}

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

func (s *Server) seenSpan(ctx context.Context, tenant string, url []byte) (seenSpan, bool) {
	s.mu.Lock()
	seen, ok := s.spans[s.spanKeyOf(tenant, url)]
	s.mu.Unlock()
	if !ok || s.engine.Images.Touch(ctx, tenant, seen.ref) != nil {
		return seenSpan{}, false
	}
	return seen, true
}

func (s *Server) rememberSpan(tenant string, url []byte, seen seenSpan) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.spans) >= 50_000 {
		clear(s.spans) // bounded: start over rather than grow
	}
	s.spans[s.spanKeyOf(tenant, url)] = seen
}
