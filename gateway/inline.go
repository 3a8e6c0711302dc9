package gateway

import (
	"bytes"
	"context"
	"hash/maphash"
	"runtime"
	"sync"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/upstream"
)

// minSpan is the smallest base64 span worth lifting out before parsing.
const minSpan = 1024

// liftInline finds the base64 images of a request body without parsing it
// as JSON — a multi-megabyte string costs encoding/json tens of
// milliseconds — stores each once, and puts its ref in its place, so only
// the small remainder is parsed. It looks for an OpenAI image URL
// ("url":"data:…;base64,…") and an Anthropic base64 source ("data":"…" in
// an object with "type":"base64"). A span holding a JSON escape is left for
// the full parse, which handles it the slow way.
func (s *Server) liftInline(ctx context.Context, tenant string, body []byte, format upstream.Format) ([]byte, error) {
	spans := findSpans(body, format)
	if len(spans) == 0 {
		return body, nil
	}
	// New images are decoded and hashed in parallel: that work is CPU-bound
	// and independent per image.
	refs := make([]blob.Ref, len(spans))
	errs := make([]error, len(spans))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	var wg sync.WaitGroup
	for i, sp := range spans {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			refs[i], errs[i] = s.liftSpan(ctx, tenant, sp)
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	out := make([]byte, 0, len(body)/8+1024)
	last := 0
	for i, sp := range spans {
		out = append(out, body[last:sp.start+1]...)
		out = append(out, engine.RefScheme...)
		out = append(out, refs[i].String()...)
		last = sp.end
	}
	return append(out, body[last:]...), nil
}

// span is one base64 image found in a body: the quotes of its JSON string
// at start and end, its declared type and its base64 text.
type span struct {
	start, end int
	mediaType  string
	b64        []byte
}

func findSpans(body []byte, format upstream.Format) []span {
	key := []byte(`"url":"data:`)
	if format == upstream.Anthropic {
		key = []byte(`"data":"`)
	}
	var out []span
	for i := 0; ; {
		j := bytes.Index(body[i:], key)
		if j < 0 {
			return out
		}
		start := i + j + len(key) - 1 // the opening quote of the value
		if format == upstream.OpenAI {
			start = i + j + len(`"url":`)
		}
		end := bytes.IndexByte(body[start+1:], '"')
		if end < 0 {
			return out
		}
		end += start + 1 // the closing quote
		value := body[start+1 : end]
		i = end + 1
		if len(value) < minSpan || bytes.IndexByte(value, '\\') >= 0 {
			continue
		}
		sp := span{start: start, end: end, b64: value}
		if format == upstream.Anthropic {
			mt, ok := anthropicSource(body, start, end)
			if !ok {
				continue
			}
			sp.mediaType = mt
		} else {
			k := bytes.Index(value[:min(len(value), 128)], []byte(";base64,"))
			if k < 0 {
				continue
			}
			sp.mediaType, sp.b64 = string(value[len("data:"):k]), value[k+len(";base64,"):]
		}
		out = append(out, sp)
	}
}

// liftSpan stores one span (or recognises it) and returns its ref.
func (s *Server) liftSpan(ctx context.Context, tenant string, sp span) (blob.Ref, error) {
	if ref, ok := s.seenSpan(ctx, tenant, sp.b64); ok {
		return ref, nil
	}
	// Decoded straight from the body: no copy of megabytes of text.
	data, canonical, err := media.DecodeBase64Bytes(sp.b64)
	if err != nil {
		return blob.Ref{}, err
	}
	in, err := s.engine.StoreBytes(ctx, tenant, data, sp.mediaType)
	if err != nil {
		return blob.Ref{}, err
	}
	if canonical {
		// The span is the base64 the upstream needs: no need to encode again.
		s.engine.PrimeBase64(in.Ref, string(sp.b64))
	}
	s.rememberSpan(tenant, sp.b64, in.Ref)
	s.metrics.images.WithLabelValues("stored", "").Inc()
	s.metrics.imageBytes.WithLabelValues("stored").Add(float64(in.Bytes))
	return in.Ref, nil
}

// anthropicSource checks that the string at body[start:end+1] is the data
// of a base64 source object and returns its media_type. The object's other
// members sit within a few hundred bytes on either side.
func anthropicSource(body []byte, start, end int) (string, bool) {
	lo := bytes.LastIndexByte(body[max(0, start-300):start], '{')
	if lo < 0 {
		return "", false
	}
	lo += max(0, start-300)
	hi := bytes.IndexByte(body[end:min(len(body), end+300)], '}')
	if hi < 0 {
		return "", false
	}
	obj := append(append([]byte(nil), body[lo:start]...), body[end+1:end+hi]...)
	if !bytes.Contains(obj, []byte(`"type":"base64"`)) {
		return "", false
	}
	k := bytes.Index(obj, []byte(`"media_type":"`))
	if k < 0 {
		return "", false
	}
	rest := obj[k+len(`"media_type":"`):]
	q := bytes.IndexByte(rest, '"')
	if q < 0 || q > 100 {
		return "", false
	}
	return string(rest[:q]), true
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

func (s *Server) seenSpan(ctx context.Context, tenant string, url []byte) (blob.Ref, bool) {
	s.mu.Lock()
	ref, ok := s.spans[s.spanKeyOf(tenant, url)]
	s.mu.Unlock()
	if !ok || s.engine.Images.Touch(ctx, tenant, ref) != nil {
		return blob.Ref{}, false
	}
	return ref, true
}

func (s *Server) rememberSpan(tenant string, url []byte, ref blob.Ref) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.spans) >= 50_000 {
		clear(s.spans) // bounded: start over rather than grow
	}
	s.spans[s.spanKeyOf(tenant, url)] = ref
}
