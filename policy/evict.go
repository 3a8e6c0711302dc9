package policy

import (
	"math"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
)

// Pressure describes a full window: the estimated prompt, the compaction
// threshold, and the low-water mark to come down to. LowWater 0 means 10%
// under the threshold; a negative one means remove every kept image.
type Pressure struct {
	Estimate  int
	Threshold int
	LowWater  int
}

func (p Pressure) lowWater() int {
	if p.LowWater != 0 {
		return p.LowWater
	}
	return p.Threshold - p.Threshold/10
}

// EvictImages removes kept images, oldest first, when the estimate passes
// the threshold, until it is down to the low-water mark — in one batch, so
// the cached prefix breaks once rather than on every turn. Each removed image
// becomes a marker with why (overflow on the reactive path, budget before a
// request, as the caller says) and its cost counts as freed (measured, less
// the marker's own text). It returns the new history, the removals, and the
// estimate after them; the caller runs compaction only if that is still
// over the threshold. Deterministic, and monotonic: a removed image is a
// marker and is never considered again.
func EvictImages(msgs []chat.Message, p Pressure, why reason.Code) ([]chat.Message, []Removal, int) {
	estimate := p.Estimate
	if estimate <= p.Threshold {
		return msgs, nil, estimate
	}
	target := p.lowWater()
	var removed []Removal
	out := editImages(msgs, func(i int, img chat.Image) ([]chat.Part, bool) {
		if img.Keep != chat.Kept || estimate <= target {
			return nil, false
		}
		marker := markerFor(img, why)
		freed := img.Cost - markerTokens(marker[0].(chat.Marker))
		estimate -= max(freed, 0)
		removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: why, Message: i, Cost: img.Cost})
		return marker, true
	})
	return out, removed, estimate
}

// markerTokens estimates a marker's own text at four characters a token.
func markerTokens(m chat.Marker) int { return (len(m.String()) + 3) / 4 }

// RemoveKept removes every kept image, as the reactive net does when the
// engine says the prompt is too long: one batch, each with why.
func RemoveKept(msgs []chat.Message, why reason.Code) ([]chat.Message, []Removal) {
	out, removed, _ := EvictImages(msgs, Pressure{Estimate: math.MaxInt / 2, Threshold: 0, LowWater: math.MinInt / 2}, why)
	return out, removed
}

// EvictOldest removes the n oldest kept images in one batch, each with why
// (the provider's image limit, say).
func EvictOldest(msgs []chat.Message, n int, why reason.Code) ([]chat.Message, []Removal) {
	return evictOldest(msgs, len(msgs), n, why)
}

// evictOldest is EvictOldest over the messages before until.
func evictOldest(msgs []chat.Message, until, n int, why reason.Code) ([]chat.Message, []Removal) {
	var removed []Removal
	out := editImages(msgs, func(i int, img chat.Image) ([]chat.Part, bool) {
		if img.Keep != chat.Kept || i >= until || len(removed) >= n {
			return nil, false
		}
		removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: why, Message: i, Cost: img.Cost})
		return markerFor(img, why), true
	})
	return out, removed
}

// ImageLimit keeps a request under a provider's image count: past limit,
// the oldest kept images leave in one batch, down to keep images (a low
// water mark, or Priced.LimitKeep), each with why — rather than one a
// request at the limit, which would break the cached prefix on every
// request. limit 0 means none.
func ImageLimit(msgs []chat.Message, limit, keep int, why reason.Code) ([]chat.Message, []Removal) {
	if limit <= 0 {
		return msgs, nil
	}
	n := countImages(msgs)
	if n <= limit {
		return msgs, nil
	}
	return EvictOldest(msgs, n-min(keep, limit), why)
}

// countImages counts the images msgs carries, in tool results too.
func countImages(msgs []chat.Message) int {
	n := 0
	eachImage(msgs, func(int, chat.Image) { n++ })
	return n
}
