package tokens

import (
	"unicode/utf8"

	"github.com/imgctx/imgctx/chat"
)

// DefaultImageTokenEstimate is the flat token estimate for one image or
// document in compaction's character accounting (config key
// compaction.image_token_estimate, env IMGCTX_IMAGE_TOKEN_ESTIMATE). It
// overestimates on purpose: compacting a little early is safe, late is not.
const DefaultImageTokenEstimate = 1600

// CharsPerToken converts the estimate into characters.
const CharsPerToken = 4

// toolOverhead stands for the JSON structure of a tool call or result
// (braces, keys, quotes) that its fields do not count.
const toolOverhead = 16

// Chars is the character weight of one message for compaction's split
// point: text counts its length in characters, an image or document counts
// imageTokenEstimate × 4 (never its base64), tool calls and results count
// their fields plus a small structural overhead, and nested parts of tool
// results are walked with the same rules. imageTokenEstimate ≤ 0 means the
// default.
func Chars(m chat.Message, imageTokenEstimate int) int {
	if imageTokenEstimate <= 0 {
		imageTokenEstimate = DefaultImageTokenEstimate
	}
	return partsChars(m.Parts, imageTokenEstimate*CharsPerToken)
}

func partsChars(parts []chat.Part, media int) int {
	n := 0
	for _, p := range parts {
		switch p := p.(type) {
		case chat.Text:
			n += utf8.RuneCountInString(p.Text)
		case chat.Image, chat.Document:
			n += media
		case chat.ToolCall:
			n += toolOverhead + utf8.RuneCountInString(p.ID) + utf8.RuneCountInString(p.Name) + utf8.RuneCountInString(p.Arguments)
		case chat.ToolResult:
			n += toolOverhead + utf8.RuneCountInString(p.CallID) + utf8.RuneCountInString(p.Name) + partsChars(p.Parts, media)
		case chat.Summary:
			n += utf8.RuneCountInString(p.Text)
		case chat.Marker:
			n += markerChars(p)
		case chat.Opaque:
			n += utf8.RuneCountInString(p.Raw)
		}
	}
	return n
}

// markerChars is the length of Marker.String() without building it.
func markerChars(m chat.Marker) int {
	n := len("[ removed]") + utf8.RuneCountInString(m.Of)
	if m.MediaType != "" && m.Of != "image" {
		n += 2 + utf8.RuneCountInString(m.MediaType)
	}
	if m.Caption != "" {
		n += 3 + utf8.RuneCountInString(m.Caption)
	}
	if m.ShowsReason() {
		n += 3 + utf8.RuneCountInString(m.Reason)
	}
	return n + chat.RecallChars(m.Handle)
}

// CharCounts computes Chars for every message once, into dst when it has
// the capacity (so a caller that reuses dst allocates nothing). The split
// point and the minimum-fraction guard share the result.
func CharCounts(dst []int, msgs []chat.Message, imageTokenEstimate int) []int {
	dst = dst[:0]
	for _, m := range msgs {
		dst = append(dst, Chars(m, imageTokenEstimate))
	}
	return dst
}
