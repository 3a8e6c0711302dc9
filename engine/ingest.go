package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/reason"
)

// RefScheme prefixes an image URL that names a stored image by ref.
const RefScheme = "imgctx:"

// Ingest turns every image and document given by URL into one stored by
// ref: data URLs are decoded, remote URLs fetched through the SSRF guard,
// "imgctx:sha256-…" looked up in the tenant's store. Each is checked (format,
// bytes, pixels) before it is stored; a refusal is a *reason.Error and
// nothing of the call is kept.
func (e *Engine) Ingest(ctx context.Context, tenant string, msgs []chat.Message) ([]chat.Message, error) {
	e.once.Do(e.init)
	out := make([]chat.Message, len(msgs))
	for i, m := range msgs {
		m = m.Clone()
		if err := e.ingestParts(ctx, tenant, m.Parts, false); err != nil {
			return nil, fmt.Errorf("message %d: %w", i, err)
		}
		out[i] = m
	}
	return out, nil
}

// ingestParts ingests parts in place; inTool says they are a tool result's.
func (e *Engine) ingestParts(ctx context.Context, tenant string, parts []chat.Part, inTool bool) error {
	for i, p := range parts {
		switch p := p.(type) {
		case chat.Image:
			if p.URL == "" {
				continue
			}
			data, in, err := e.resolve(ctx, tenant, p.URL)
			if err != nil {
				return err
			}
			if in.Kind != media.KindImage {
				return reason.New(reason.Invalid, in.MediaType+" sent as an image")
			}
			p.MediaType, p.Bytes, p.Width, p.Height = in.MediaType, in.Bytes, in.Width, in.Height
			if err := e.store(ctx, tenant, in, data); err != nil {
				if !inTool || reason.Of(err) != reason.Refused || data == nil {
					return err
				}
				// Seed keep-turn-images, "rangement refusé": a tool image
				// the store refuses stays inline, ephemeral, for its turn
				// only (relaying it stops keeping for the turn); it is a
				// marker from the next turn on.
				e.log().WarnContext(ctx, "the image store refused a tool image: it is sent this turn only", "err", err)
				parts[i] = p
				continue
			}
			p.URL, p.Ref = "", in.Ref
			parts[i] = p
		case chat.Document:
			if p.URL == "" {
				continue
			}
			data, in, err := e.resolve(ctx, tenant, p.URL)
			if err != nil {
				return err
			}
			if err := e.store(ctx, tenant, in, data); err != nil {
				return err
			}
			p.URL, p.Ref, p.MediaType, p.Pages = "", in.Ref, in.MediaType, in.Pages
			parts[i] = p
		case chat.ToolResult:
			if err := e.ingestParts(ctx, tenant, p.Parts, true); err != nil {
				return err
			}
		}
	}
	return nil
}

func (e *Engine) store(ctx context.Context, tenant string, in media.Info, data []byte) error {
	if data == nil {
		return nil // already stored (an imgctx: ref)
	}
	// media.Inspect computed in.Ref from data just now.
	if err := imagestore.PutComputed(ctx, e.Images, tenant, in.Ref, data); err != nil {
		return reason.Wrap(reason.Refused, "the image store refused the image", err)
	}
	e.meta.put(in)
	return nil
}

// Check inspects image or document bytes that arrived outside a message
// (a span the gateway read from a body) against the engine's limits,
// storing nothing: a caller taking several stores them with Put only once
// all are accepted.
func (e *Engine) Check(data []byte, declared string) (media.Info, error) {
	return media.Inspect(data, declared, e.Limits)
}

// Resolve returns the bytes behind an image URL — a data URL, a remote URL
// through the SSRF guard, an imgctx: ref of the tenant's (then the bytes
// are nil: stored already) — and what they are, checked, storing nothing.
func (e *Engine) Resolve(ctx context.Context, tenant, url string) ([]byte, media.Info, error) {
	e.once.Do(e.init)
	return e.resolve(ctx, tenant, url)
}

// Put stores bytes Check or Resolve accepted, once by ref; nil data is an
// image stored already.
func (e *Engine) Put(ctx context.Context, tenant string, in media.Info, data []byte) error {
	e.once.Do(e.init)
	return e.store(ctx, tenant, in, data)
}

// Lookup returns what a stored image or document of the tenant is, from
// the metadata cache when it can: an unknown ref is ErrUnknownRef.
func (e *Engine) Lookup(ctx context.Context, tenant string, ref blob.Ref) (media.Info, error) {
	e.once.Do(e.init)
	_, in, err := e.resolve(ctx, tenant, RefScheme+ref.String())
	return in, err
}

// resolve returns the bytes behind an image URL (nil for a stored ref) and
// what they are.
func (e *Engine) resolve(ctx context.Context, tenant, url string) ([]byte, media.Info, error) {
	switch {
	case strings.HasPrefix(url, RefScheme):
		ref, err := blob.Parse(strings.TrimPrefix(url, RefScheme))
		if err != nil {
			return nil, media.Info{}, reason.Wrap(reason.Invalid, "bad imgctx ref", err)
		}
		// Known refs need only a Stat (is it the tenant's?), not a read.
		if in, ok := e.meta.get(ref); ok {
			if _, err := e.Images.Stat(ctx, tenant, ref); err == nil {
				return nil, in, nil
			}
		}
		data, err := e.Images.Get(ctx, tenant, ref)
		if errors.Is(err, imagestore.ErrNotFound) {
			return nil, media.Info{}, fmt.Errorf("%w: %s", ErrUnknownRef, ref)
		}
		if err != nil {
			return nil, media.Info{}, err
		}
		in, err := media.Inspect(data, "", e.Limits)
		if err == nil {
			e.meta.put(in)
		}
		return nil, in, err
	case len(url) > 5 && strings.EqualFold(url[:5], "data:"):
		d, err := media.ParseDataURL(url)
		if err != nil {
			return nil, media.Info{}, err
		}
		in, err := media.Inspect(d.Data, d.MediaType, e.Limits)
		return d.Data, in, err
	case strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://"):
		if e.Fetcher == nil {
			return nil, media.Info{}, reason.New(reason.FetchFailed, "image URLs are not fetched by this engine")
		}
		f, err := e.Fetcher.Fetch(ctx, url)
		if err != nil {
			return nil, media.Info{}, err
		}
		in, err := media.Inspect(f.Data, f.ContentType, e.Limits)
		return f.Data, in, err
	}
	return nil, media.Info{}, reason.New(reason.Invalid, "image URL must be a data URL, http(s), or imgctx:sha256-…")
}

// metaCache remembers what a stored image is (type, size, dimensions) by
// ref, so a request naming it by ref needs no read and no hash. Refs are
// content addresses: an entry never goes stale.
type metaCache struct {
	mu  sync.Mutex
	max int
	m   map[blob.Ref]media.Info
}

func (c *metaCache) get(ref blob.Ref) (media.Info, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	in, ok := c.m[ref]
	return in, ok
}

func (c *metaCache) put(in media.Info) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= c.max {
		clear(c.m) // bounded: start over rather than grow
	}
	c.m[in.Ref] = in
}
