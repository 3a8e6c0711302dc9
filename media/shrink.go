package media

import (
	"bytes"
	"container/list"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/jpeg"
	"image/png"
	"sync"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/reason"
	xdraw "golang.org/x/image/draw"
)

// Target is what Shrink aims for. Zero fields take the defaults.
type Target struct {
	MaxEdge  int   // longest edge in pixels; default 1568
	MaxBytes int64 // encoded size; default 400 KB
}

// Default shrink target.
const (
	DefaultMaxEdge     = 1568
	DefaultTargetBytes = 400 << 10
)

func (t Target) norm() Target {
	if t.MaxEdge <= 0 {
		t.MaxEdge = DefaultMaxEdge
	}
	if t.MaxBytes <= 0 {
		t.MaxBytes = DefaultTargetBytes
	}
	return t
}

// Shrunk is the result of Shrink.
type Shrunk struct {
	Data      []byte
	MediaType string
	Width     int
	Height    int
	Changed   bool // false when the input already met the target and is returned as is
}

// jpegLadder is the quality ladder tried, best first.
var jpegLadder = []int{90, 80, 70, 60, 50, 40}

// Shrink makes an image fit t: longest edge at most MaxEdge and at most
// MaxBytes encoded. EXIF orientation is applied (the output is upright).
// Images with few colours (screenshots, diagrams) are tried as PNG first,
// then everything goes down a JPEG quality ladder, then the edge shrinks by
// a quarter and the ladder repeats. An image that already fits is returned
// unchanged. The pixel limit is checked from the header before decoding.
func Shrink(data []byte, t Target, lim Limits) (Shrunk, error) {
	t = t.norm()
	in, err := Inspect(data, "", lim)
	if err != nil {
		return Shrunk{}, err
	}
	if in.Kind != KindImage {
		return Shrunk{}, reason.New(reason.Invalid, in.MediaType+" is not an image")
	}
	orient := jpegOrientation(data)
	if max(in.Width, in.Height) <= t.MaxEdge && in.Bytes <= t.MaxBytes && orient <= 1 {
		return Shrunk{Data: data, MediaType: in.MediaType, Width: in.Width, Height: in.Height}, nil
	}
	src, _, err := image.Decode(bytes.NewReader(data))
	if err != nil {
		return Shrunk{}, reason.Wrap(reason.Invalid, "undecodable image", err)
	}
	src = applyOrientation(src, orient)
	tryPNG := in.MediaType == "image/png" || in.MediaType == "image/gif"
	edge := min(t.MaxEdge, max(in.Width, in.Height))
	for range 8 {
		img := resize(src, edge)
		if tryPNG {
			var buf bytes.Buffer
			if err := png.Encode(&buf, img); err == nil && int64(buf.Len()) <= t.MaxBytes {
				return shrunk(buf.Bytes(), "image/png", img), nil
			}
		}
		flat := flatten(img)
		for _, q := range jpegLadder {
			var buf bytes.Buffer
			if err := jpeg.Encode(&buf, flat, &jpeg.Options{Quality: q}); err != nil {
				return Shrunk{}, fmt.Errorf("encode jpeg: %w", err)
			}
			if int64(buf.Len()) <= t.MaxBytes {
				return shrunk(buf.Bytes(), "image/jpeg", img), nil
			}
		}
		edge = edge * 3 / 4
		if edge < 16 {
			break
		}
	}
	return Shrunk{}, reason.New(reason.TooLarge, fmt.Sprintf("cannot shrink under %d bytes", t.MaxBytes))
}

func shrunk(b []byte, mt string, img image.Image) Shrunk {
	r := img.Bounds()
	return Shrunk{Data: bytes.Clone(b), MediaType: mt, Width: r.Dx(), Height: r.Dy(), Changed: true}
}

// DefaultShrinkMemory is what the decodes of all requests may hold at once
// by default (engine.Config.ShrinkMemory): two 2500×2500 screenshots
// shrunk for Claude's many-image rule, or fourteen 1920×1080 ones.
const DefaultShrinkMemory = 512 << 20

// ShrinkMemory is what shrinking a w×h image to its target's edge holds at
// its peak, in bytes: the decoded image (4 bytes a pixel), the scaler's
// intermediate (32 bytes a pixel of the target's width by the source's
// height: Catmull-Rom is separable, in float64 per channel), and the
// scaled, flattened and encoded copies (12 bytes a target pixel). Decoding
// a 2500×2500 PNG for a 2000-pixel edge holds about 230 MB, 37 bytes a
// source pixel: a budget of pixels undercounts it ninefold.
func ShrinkMemory(w, h int, t Target) int64 {
	t = t.norm()
	dw, dh := w, h
	if e := t.MaxEdge; max(w, h) > e {
		if w >= h {
			dw, dh = e, max(1, h*e/w)
		} else {
			dw, dh = max(1, w*e/h), e
		}
	}
	return 4*int64(w)*int64(h) + 32*int64(dw)*int64(h) + 12*int64(dw)*int64(dh)
}

// resize scales src so its longest edge is at most edge, keeping the aspect.
func resize(src image.Image, edge int) image.Image {
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	if max(w, h) <= edge {
		return src
	}
	if w >= h {
		h, w = max(1, h*edge/w), edge
	} else {
		w, h = max(1, w*edge/h), edge
	}
	dst := image.NewRGBA(image.Rect(0, 0, w, h))
	xdraw.CatmullRom.Scale(dst, dst.Bounds(), src, b, draw.Src, nil)
	return dst
}

// flatten composes img over white: JPEG has no alpha.
func flatten(img image.Image) image.Image {
	b := img.Bounds()
	dst := image.NewRGBA(image.Rect(0, 0, b.Dx(), b.Dy()))
	draw.Draw(dst, dst.Bounds(), image.NewUniform(color.White), image.Point{}, draw.Src)
	draw.Draw(dst, dst.Bounds(), img, b.Min, draw.Over)
	return dst
}

// applyOrientation turns src upright according to an EXIF orientation.
func applyOrientation(src image.Image, o int) image.Image {
	if o <= 1 || o > 8 {
		return src
	}
	b := src.Bounds()
	w, h := b.Dx(), b.Dy()
	dw, dh := w, h
	if o >= 5 {
		dw, dh = h, w
	}
	dst := image.NewRGBA(image.Rect(0, 0, dw, dh))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			var dx, dy int
			switch o {
			case 2:
				dx, dy = w-1-x, y
			case 3:
				dx, dy = w-1-x, h-1-y
			case 4:
				dx, dy = x, h-1-y
			case 5:
				dx, dy = y, x
			case 6:
				dx, dy = h-1-y, x
			case 7:
				dx, dy = h-1-y, w-1-x
			case 8:
				dx, dy = y, w-1-x
			}
			dst.Set(dx, dy, src.At(b.Min.X+x, b.Min.Y+y))
		}
	}
	return dst
}

// Shrinker caches Shrink results by (ref, target), so an image shrunk for one
// request costs nothing on the next. Safe for concurrent use.
type Shrinker struct {
	// Limits applies to the inputs.
	Limits Limits
	// MaxEntries bounds the cache; 0 means 256.
	MaxEntries int

	mu    sync.Mutex
	order *list.List // front = most recent; values are shrinkKey
	cache map[shrinkKey]shrinkEntry
}

type shrinkKey struct {
	ref blob.Ref
	t   Target
}

type shrinkEntry struct {
	res  Shrunk
	elem *list.Element
}

// Cached returns the result for (ref, t) when it is cached, without
// decoding anything: a caller that budgets decoding charges only misses.
func (s *Shrinker) Cached(ref blob.Ref, t Target) (Shrunk, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.cache[shrinkKey{ref: ref, t: t.norm()}]
	if ok {
		s.order.MoveToFront(e.elem)
	}
	return e.res, ok
}

// Shrink returns the cached result for (ref of data, t), computing it once.
func (s *Shrinker) Shrink(data []byte, t Target) (Shrunk, error) {
	k := shrinkKey{ref: blob.Of(data), t: t.norm()}
	s.mu.Lock()
	if e, ok := s.cache[k]; ok {
		s.order.MoveToFront(e.elem)
		s.mu.Unlock()
		return e.res, nil
	}
	s.mu.Unlock()
	res, err := Shrink(data, t, s.Limits)
	if err != nil {
		return Shrunk{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache == nil {
		s.cache, s.order = map[shrinkKey]shrinkEntry{}, list.New()
	}
	if _, ok := s.cache[k]; !ok {
		s.cache[k] = shrinkEntry{res: res, elem: s.order.PushFront(k)}
	}
	maxN := s.MaxEntries
	if maxN <= 0 {
		maxN = 256
	}
	for s.order.Len() > maxN {
		old := s.order.Remove(s.order.Back()).(shrinkKey)
		delete(s.cache, old)
	}
	return res, nil
}

// Len reports how many results are cached.
func (s *Shrinker) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.cache)
}
