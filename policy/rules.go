package policy

import (
	"context"
	"fmt"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
)

// Shrinker makes an image fit a longest edge and a byte size, storing the
// result and returning it as a new image by ref. The engine implements it
// with media.Shrinker and the image store.
type Shrinker interface {
	Shrink(ctx context.Context, img chat.Image, maxEdge int, maxBytes int64) (chat.Image, error)
}

// Planner is a Shrinker that is shown, before any image is shrunk, every
// image a request will shrink and its target — so that one which bounds
// the work can refuse a request before decoding anything of it (then each
// Shrink fails, and its caller can refuse the request).
type Planner interface {
	Plan(ctx context.Context, plans []Plan)
}

// Plan is one image a request will shrink, and to what.
type Plan struct {
	Image    chat.Image
	MaxEdge  int
	MaxBytes int64
}

// Shrunk records an image replaced by a smaller copy to meet a rule.
type Shrunk struct {
	From, To chat.Image
	Message  int
	Rule     string
}

// CheckProviderRules makes an outgoing request (the summariser's included)
// meet the provider's limits from the model profile: at most MaxImages images
// (the oldest beyond it leave), at most MaxImageBytes per image, at most
// MaxEdge pixels on a side, and the many-image rule (more than
// ManyImagesAbove images → ManyImagesMaxEdge). An image over a size limit is
// shrunk when sh is not nil, otherwise — or when shrinking fails — it is
// replaced by a marker with reason provider_limit. msgs is not modified and
// comes back as is when everything fits.
func CheckProviderRules(ctx context.Context, msgs []chat.Message, lim tokens.Limits, sh Shrinker) ([]chat.Message, []Removal, []Shrunk) {
	total := 0
	eachImage(msgs, func(int, chat.Image) { total++ })
	drop := 0
	if lim.MaxImages > 0 && total > lim.MaxImages {
		drop = total - lim.MaxImages
	}
	maxEdge := lim.MaxEdge
	if lim.ManyImagesAbove > 0 && total-drop > lim.ManyImagesAbove && lim.ManyImagesMaxEdge > 0 {
		if maxEdge == 0 || lim.ManyImagesMaxEdge < maxEdge {
			maxEdge = lim.ManyImagesMaxEdge
		}
	}
	if planner, ok := sh.(Planner); ok {
		var plans []Plan
		seen := 0
		eachImage(msgs, func(_ int, img chat.Image) {
			if seen++; seen > drop && violation(img, maxEdge, lim.MaxImageBytes) != "" {
				plans = append(plans, Plan{Image: img, MaxEdge: maxEdge, MaxBytes: lim.MaxImageBytes})
			}
		})
		if len(plans) > 0 {
			planner.Plan(ctx, plans)
		}
	}
	var removed []Removal
	var shrunk []Shrunk
	seen := 0
	out := editImages(msgs, func(i int, img chat.Image) ([]chat.Part, bool) {
		seen++
		if seen <= drop {
			removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: reason.ProviderLimit, Message: i, Cost: img.Cost})
			return markerFor(img, reason.ProviderLimit), true
		}
		rule := violation(img, maxEdge, lim.MaxImageBytes)
		if rule == "" {
			return nil, false
		}
		if sh != nil {
			small, err := sh.Shrink(ctx, img, maxEdge, lim.MaxImageBytes)
			if err == nil && violation(small, maxEdge, lim.MaxImageBytes) == "" {
				shrunk = append(shrunk, Shrunk{From: img, To: small, Message: i, Rule: rule})
				return []chat.Part{small}, true
			}
		}
		removed = append(removed, Removal{Ref: img.Ref, Of: "image", Reason: reason.ProviderLimit, Message: i, Cost: img.Cost})
		return markerFor(img, reason.ProviderLimit), true
	})
	return out, removed, shrunk
}

// violation names the size rule img breaks, or "" when it fits. Unknown
// dimensions or size (0) are not judged.
func violation(img chat.Image, maxEdge int, maxBytes int64) string {
	switch {
	case maxBytes > 0 && img.Bytes > maxBytes:
		return fmt.Sprintf("%d bytes over %d", img.Bytes, maxBytes)
	case maxEdge > 0 && max(img.Width, img.Height) > maxEdge:
		return fmt.Sprintf("%d px over %d", max(img.Width, img.Height), maxEdge)
	}
	return ""
}

// ResizeNote is the text a model reads beside an image imgctx shrank:
// computer-use agents click in image coordinates, so the scale back to the
// original matters. Deterministic, so the prefix stays stable.
func ResizeNote(fromW, fromH, toW, toH int) string {
	scale := 1.0
	if toW > 0 {
		scale = float64(fromW) / float64(toW)
	}
	return fmt.Sprintf("[imgctx: the image above was resized from %dx%d to %dx%d to meet the provider's limits; multiply its coordinates by %.4g to get coordinates in the original]",
		fromW, fromH, toW, toH, scale)
}

// NoteResized puts the ResizeNote of each shrunk image right after it, in
// its message or tool result. msgs is not modified.
func NoteResized(msgs []chat.Message, shrunk []Shrunk) []chat.Message {
	if len(shrunk) == 0 {
		return msgs
	}
	from := map[blob.Ref]chat.Image{}
	for _, s := range shrunk {
		from[s.To.Ref] = s.From
	}
	return editImages(msgs, func(_ int, img chat.Image) ([]chat.Part, bool) {
		orig, was := from[img.Ref]
		if !was {
			return nil, false
		}
		return []chat.Part{img, chat.Text{Text: ResizeNote(orig.Width, orig.Height, img.Width, img.Height)}}, true
	})
}
