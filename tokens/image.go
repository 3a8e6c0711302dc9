package tokens

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Estimate is an image's planned cost and the size the provider will see.
type Estimate struct {
	Tokens int // image tokens, markers included
	Width  int // after the provider's resizing
	Height int
	Units  int // tiles or patches counted, where the rule counts any
}

// Errors an estimate can return.
var (
	ErrNoVision      = errors.New("model does not accept images")
	ErrBadDimensions = errors.New("image dimensions must be positive")
	ErrRejected      = errors.New("provider would reject this image")
	ErrUnknownDetail = errors.New("unknown detail level")
)

// ImageTokens is the planned token cost of a w×h image at the given detail
// ("" means the provider default).
func ImageTokens(p Profile, w, h int, detail string) (int, error) {
	e, err := EstimateImage(p, w, h, detail)
	return e.Tokens, err
}

// EstimateImage applies the profile's image rule. Size-independent rules
// (fixed, gemini_media_resolution) ignore w and h.
func EstimateImage(p Profile, w, h int, detail string) (Estimate, error) {
	r := p.Image
	switch r.Rule {
	case "fixed":
		return Estimate{Tokens: r.Tokens, Width: w, Height: h}, nil
	case "gemini_media_resolution":
		n, err := level(r.Resolutions, detail)
		return Estimate{Tokens: n, Width: w, Height: h}, err
	case "none", "":
		return Estimate{}, ErrNoVision
	}
	if w <= 0 || h <= 0 {
		return Estimate{}, fmt.Errorf("%w: %d×%d", ErrBadDimensions, w, h)
	}
	switch r.Rule {
	case "openai_tile":
		return openaiTile(r, w, h, normDetail(detail)), nil
	case "openai_patch":
		return openaiPatch(r, w, h, normDetail(detail))
	case "anthropic_patch":
		rw, rh := anthropicResize(w, h, r.MaxEdge, r.MaxTokens)
		n := ceilDiv(rw, 28) * ceilDiv(rh, 28)
		return Estimate{Tokens: n, Width: rw, Height: rh, Units: n}, nil
	case "anthropic_area":
		return anthropicArea(r, w, h), nil
	case "gemini_tile":
		if w <= r.SmallEdge && h <= r.SmallEdge {
			return Estimate{Tokens: r.Tokens, Width: w, Height: h, Units: 1}, nil
		}
		tiles := ceilDiv(w, r.Tile) * ceilDiv(h, r.Tile)
		return Estimate{Tokens: tiles * r.Tokens, Width: w, Height: h, Units: tiles}, nil
	case "qwen_smart_resize":
		rh, rw, err := smartResize(h, w, r.Factor, r.MinPixels, r.MaxPixels)
		if err != nil {
			return Estimate{}, err
		}
		n := (rh / r.Factor) * (rw / r.Factor)
		return Estimate{Tokens: n + r.MarkerTokens, Width: rw, Height: rh, Units: n}, nil
	}
	return Estimate{}, fmt.Errorf("unknown image rule %q", r.Rule)
}

// PageTokens is the planned cost of one PDF page where the provider prices
// pages (Gemini); ok is false when the profile has no page price.
func PageTokens(p Profile, detail string) (n int, ok bool) {
	n, err := level(p.Image.PageTokens, detail)
	return n, err == nil && n > 0
}

// normDetail lower-cases a detail hint and drops provider prefixes:
// "MEDIA_RESOLUTION_LOW" → "low", "unspecified" → "".
func normDetail(d string) string {
	d = strings.ToLower(strings.TrimSpace(d))
	d = strings.TrimPrefix(d, "media_resolution_")
	if d == "unspecified" || d == "auto" || strings.HasPrefix(d, "input_fidelity") {
		return ""
	}
	return d
}

func level(table map[string]int, detail string) (int, error) {
	d := normDetail(detail)
	if d == "" {
		d = "default"
	}
	if n, ok := table[d]; ok {
		return n, nil
	}
	return 0, fmt.Errorf("%w %q", ErrUnknownDetail, detail)
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// openaiTile: fit in 2048×2048 (never enlarge; that step rounds to nearest,
// ties to even, as billing data shows), then bring the shortest side down to
// 768 px (512 for gpt-image-1) flooring the other side, then count 512-px
// tiles. "low" costs the base only.
func openaiTile(r ImageRule, w, h int, detail string) Estimate {
	if detail == "low" {
		return Estimate{Tokens: r.BaseTokens, Width: w, Height: h}
	}
	short := r.TileShortSide
	if short == 0 {
		short = 768
	}
	if m := max(w, h); m > 2048 {
		s := 2048 / float64(m)
		w, h = int(math.RoundToEven(float64(w)*s)), int(math.RoundToEven(float64(h)*s))
	}
	if m := min(w, h); m > short {
		if w <= h {
			w, h = short, h*short/w
		} else {
			w, h = w*short/h, short
		}
	}
	tiles := ceilDiv(w, 512) * ceilDiv(h, 512)
	return Estimate{Tokens: r.BaseTokens + r.TileTokens*tiles, Width: w, Height: h, Units: tiles}
}

// openaiPatch: fit the level's pixel limit (rounding to integers, never
// enlarging), count 32-px patches, shrink to the patch budget if over it,
// multiply and round up. Over 30,000 patches the API rejects the image.
func openaiPatch(r ImageRule, w, h int, detail string) (Estimate, error) {
	if detail == "" {
		detail = r.Auto
	}
	lv, ok := r.Levels[detail]
	if !ok {
		return Estimate{}, fmt.Errorf("%w %q for this model", ErrUnknownDetail, detail)
	}
	if m := max(w, h); lv.MaxDim > 0 && m > lv.MaxDim {
		s := float64(lv.MaxDim) / float64(m)
		w, h = max(1, int(math.Round(float64(w)*s))), max(1, int(math.Round(float64(h)*s)))
	}
	n := ceilDiv(w, 32) * ceilDiv(h, 32)
	if lv.Budget > 0 && n > lv.Budget {
		fw, fh := float64(w), float64(h)
		s := math.Sqrt(32 * 32 * float64(lv.Budget) / (fw * fh))
		s *= min(math.Floor(fw*s/32)/(fw*s/32), math.Floor(fh*s/32)/(fh*s/32))
		// The epsilon keeps an exact product such as 1056.0000000001 or
		// 1055.9999999999 on the integer the documented arithmetic means.
		w, h = int(math.Floor(fw*s+1e-9)), int(math.Floor(fh*s+1e-9))
		n = ceilDiv(w, 32) * ceilDiv(h, 32)
	}
	if n > 30000 {
		return Estimate{}, fmt.Errorf("%w: %d patches after resizing (limit 30000)", ErrRejected, n)
	}
	return Estimate{Tokens: int(math.Ceil(float64(n)*r.Multiplier - 1e-9)), Width: w, Height: h, Units: n}, nil
}

// anthropicResize is the reference implementation from Anthropic's vision
// docs: the largest aspect-preserving size whose padded edges fit maxEdge
// and whose 28-px patch count fits maxTokens (binary search; half-to-even
// rounding; tall images search with axes swapped).
func anthropicResize(w, h, maxEdge, maxTokens int) (int, int) {
	fits := func(w, h int) bool {
		return ceilDiv(w, 28)*28 <= maxEdge && ceilDiv(h, 28)*28 <= maxEdge &&
			ceilDiv(w, 28)*ceilDiv(h, 28) <= maxTokens
	}
	if fits(w, h) {
		return w, h
	}
	if h > w {
		rh, rw := anthropicResize(h, w, maxEdge, maxTokens)
		return rw, rh
	}
	aspect := float64(w) / float64(h)
	other := func(x int) int { return max(int(math.RoundToEven(float64(x)/aspect)), 1) }
	lo, hi := 1, w
	for lo+1 < hi {
		mid := (lo + hi) / 2
		if fits(mid, other(mid)) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo, other(lo)
}

// anthropicArea is the legacy rule: scale down until the long edge and the
// area estimate fit, then tokens = ceil(w*h/750).
func anthropicArea(r ImageRule, w, h int) Estimate {
	fw, fh := float64(w), float64(h)
	if m := math.Max(fw, fh); m > float64(r.MaxEdge) {
		s := float64(r.MaxEdge) / m
		fw, fh = fw*s, fh*s
	}
	if area := fw * fh / 750; area > float64(r.MaxTokens) {
		s := math.Sqrt(float64(r.MaxTokens) / area)
		fw, fh = fw*s, fh*s
	}
	w, h = max(1, int(fw)), max(1, int(fh))
	return Estimate{Tokens: int(math.Ceil(float64(w*h) / 750)), Width: w, Height: h}
}

// smartResize is qwen-vl-utils' smart_resize: round each side to the nearest
// multiple of factor (half to even), then shrink (floor) or grow (ceil) the
// original size into [minPixels, maxPixels]. Aspect ratios over 200 are
// refused, as the processor refuses them.
func smartResize(h, w, factor int, minPixels, maxPixels int64) (int, int, error) {
	if float64(max(h, w))/float64(min(h, w)) > 200 {
		return 0, 0, fmt.Errorf("%w: aspect ratio over 200", ErrRejected)
	}
	f := float64(factor)
	round := func(n float64) int { return max(factor, int(math.RoundToEven(n/f))*factor) }
	hb, wb := round(float64(h)), round(float64(w))
	switch {
	case int64(hb)*int64(wb) > maxPixels:
		beta := math.Sqrt(float64(h) * float64(w) / float64(maxPixels))
		hb = max(factor, int(math.Floor(float64(h)/beta/f))*factor)
		wb = max(factor, int(math.Floor(float64(w)/beta/f))*factor)
	case int64(hb)*int64(wb) < minPixels:
		beta := math.Sqrt(float64(minPixels) / (float64(h) * float64(w)))
		hb = int(math.Ceil(float64(h)*beta/f)) * factor
		wb = int(math.Ceil(float64(w)*beta/f)) * factor
	}
	return hb, wb, nil
}

// Per-page costs of a PDF where the profile gives none: Anthropic bills a
// page's text and an image of it (measured at 2,100–2,500 tokens for a
// page of text); elsewhere the flat image estimate.
const anthropicPageTokens = 2400

// DocumentTokens estimates what a PDF of pages pages costs on p: the
// profile's page_tokens (Gemini documents 258 a page on 2.x and 560 by
// default on 3), else the family's measured figure, else
// DefaultImageTokenEstimate a page. Measurements correct it as for images.
func DocumentTokens(p Profile, pages int) int {
	pages = max(pages, 1)
	if t, ok := p.Image.PageTokens["default"]; ok && t > 0 {
		return pages * t
	}
	if p.Family == "anthropic" {
		return pages * anthropicPageTokens
	}
	return pages * DefaultImageTokenEstimate
}
