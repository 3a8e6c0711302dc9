package engine

import (
	"container/list"
	"context"
	"fmt"
	"sync"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/media"
)

// Thumbnail sizes: small enough for a timeline of dozens, large enough to
// read a screen's layout.
const (
	ThumbEdge  = 320
	thumbBytes = 48 << 10
	thumbsHeld = 512
)

// Thumbnail is a small JPEG or PNG of a stored image of the tenant, made
// once and kept (the newest 512): the dashboard shows what each request
// carried. A ref the tenant has not stored is imagestore.ErrNotFound.
func (e *Engine) Thumbnail(ctx context.Context, tenant string, ref blob.Ref) (data []byte, mediaType string, err error) {
	e.once.Do(e.init)
	key := tenant + "/" + ref.String()
	if t, ok := e.thumbs.get(key); ok {
		return t.data, t.mediaType, nil
	}
	src, err := e.Images.Get(ctx, tenant, ref)
	if err != nil {
		return nil, "", err
	}
	in, err := media.Inspect(src, "", e.Limits)
	if err != nil {
		return nil, "", err
	}
	t := media.Target{MaxEdge: ThumbEdge, MaxBytes: thumbBytes}
	weight := min(media.ShrinkMemory(in.Width, in.Height, t), e.decodeSlots.size)
	if err := e.decodeSlots.Acquire(ctx, tenant, weight); err != nil {
		return nil, "", err
	}
	sh, err := media.Shrink(src, t, e.Limits)
	e.decodeSlots.Release(tenant, weight)
	if err != nil {
		return nil, "", fmt.Errorf("thumbnail of %s: %w", ref, err)
	}
	e.thumbs.put(key, thumb{sh.Data, sh.MediaType})
	return sh.Data, sh.MediaType, nil
}

type thumb struct {
	data      []byte
	mediaType string
}

// thumbCache keeps the newest thumbnails.
type thumbCache struct {
	mu    sync.Mutex
	m     map[string]*list.Element
	order *list.List
}

type thumbEntry struct {
	key string
	t   thumb
}

func newThumbCache() *thumbCache {
	return &thumbCache{m: map[string]*list.Element{}, order: list.New()}
}

func (c *thumbCache) get(key string) (thumb, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[key]
	if !ok {
		return thumb{}, false
	}
	c.order.MoveToFront(el)
	return el.Value.(thumbEntry).t, true
}

func (c *thumbCache) put(key string, t thumb) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.m[key]; ok {
		return
	}
	c.m[key] = c.order.PushFront(thumbEntry{key, t})
	for c.order.Len() > thumbsHeld {
		old := c.order.Remove(c.order.Back()).(thumbEntry)
		delete(c.m, old.key)
	}
}
