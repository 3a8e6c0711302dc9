// Package chat is imgctx's conversation model: plain data with no I/O and no
// provider types. A conversation is an ordered list of Messages; a Message is
// a role and a closed set of Parts. History holds images by reference
// (blob.Ref), never their bytes.
package chat

import (
	"bytes"
	"encoding/json"
	"slices"
	"unicode/utf8"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/mimetype"
	"github.com/imgctx/imgctx/reason"
)

// Role is who wrote a message.
type Role string

const (
	System    Role = "system"
	User      Role = "user"
	Assistant Role = "assistant"
	Tool      Role = "tool"
)

// Thread tells a discussion's main thread from a sub-agent's thread; only the
// main thread may keep images across turns.
type Thread string

const (
	Main Thread = "main"
	Sub  Thread = "sub"
)

// Origin says who put an image into the conversation.
type Origin string

const (
	FromUser Origin = "user"
	FromTool Origin = "tool"
)

// Keep is the keep state of a tool image (docs/design.md "Keep state").
// The zero value means the image is not under keep management (user images).
type Keep string

const (
	Ephemeral Keep = "ephemeral" // sent during its turn only
	Trial     Keep = "trial"     // kept on probation until measured
	Kept      Keep = "kept"      // measured cost known, stays in history
	Removed   Keep = "removed"   // replaced by a Marker
)

// Settings are per-conversation switches.
type Settings struct {
	Model          string
	KeepTurnImages bool
	// Recall offers the model the recall tool: markers name a handle, and
	// the engine answers the model's calls from the image store.
	Recall bool
}

// Message is one role's contribution: a list of parts.
type Message struct {
	Role  Role
	Parts []Part
	// Extra holds the message's wire fields imgctx does not model, raw and
	// keyed by name, so a request passes through byte-stable. Opaque: no
	// policy reads it.
	Extra map[string]json.RawMessage
	// Wire names the wire format the message was decoded from ("openai",
	// "anthropic"; "" for imgctx's own). Extra, and the Extra of its parts,
	// hold that wire's fields: an encoder for another wire leaves them out.
	Wire string
	// ImagelessBefore, set by a scan, is how many messages right before
	// this one hold no image, nested or not: the engine's passes over a
	// long history step over them (Imaged). Zero says nothing. It holds
	// for the history the scan read, so an image may only be put where the
	// scan found one, and messages moved elsewhere lose it (Unlink).
	ImagelessBefore int
}

// Part is one piece of a message. The set is closed: Text, Image, Document,
// ToolCall, ToolResult, Summary, Marker and Opaque.
type Part interface {
	// Kind names the part in the JSON encoding ("text", "image", ...).
	Kind() string
	part()
}

// Text is plain text.
type Text struct {
	Text string
	// Extra is a raw JSON object of the part's wire fields imgctx does not
	// model ("" when none), kept so a rewritten request still carries them.
	// Opaque: only codecs read it.
	Extra string
}

// Image is an image by reference, with what is known of it.
// URL is set instead of Ref for a remote image not fetched yet.
type Image struct {
	Ref       blob.Ref
	URL       string
	MediaType string
	Bytes     int64 // size of the decoded image
	Width     int
	Height    int
	Detail    string // provider detail hint ("low", "high", "auto", ...), "" for default
	Origin    Origin
	Caption   string
	Keep      Keep
	Cost      int // measured image tokens; 0 until measured
	// Occ numbers a tool image among its open turn's relays (1, 2, …), so a
	// screenshot shown twice is two occurrences with their own keep
	// decisions; 0 outside the open turn.
	Occ int
	// Extra is a raw JSON object of the part's wire fields imgctx does not
	// model ("" when none), kept so a rewritten request still carries them.
	// Opaque: only codecs read it.
	Extra string
}

// Document is a non-image attachment (a PDF, say) by reference. It travels
// natively where the wire carries documents (Anthropic document, OpenAI
// file), stored once by ref like an image, and as its extracted text only on
// a wire that cannot carry it.
type Document struct {
	Ref       blob.Ref
	URL       string // a data URL or remote URL not ingested yet, instead of Ref
	MediaType string
	Name      string
	Pages     int    // a PDF's pages, when known
	Text      string // extracted text, if any
	Caption   string
	// Extra is a raw JSON object of the part's wire fields imgctx does not
	// model ("" when none), kept so a rewritten request still carries them.
	// Opaque: only codecs read it.
	Extra string
}

// ToolCall is an assistant's request to run a tool. Arguments is the raw JSON
// the model produced, kept verbatim.
type ToolCall struct {
	ID        string
	Name      string
	Arguments string
	// Extra is a raw JSON object of the part's wire fields imgctx does not
	// model ("" when none), kept so a rewritten request still carries them.
	// Opaque: only codecs read it.
	Extra string
}

// ToolResult is a tool's answer to a ToolCall. Tools return images inside
// results, so Parts may hold any part but another ToolResult's call.
type ToolResult struct {
	CallID  string
	Name    string
	IsError bool
	Parts   []Part
	// Extra is a raw JSON object of the part's wire fields imgctx does not
	// model ("" when none), kept so a rewritten request still carries them.
	// Opaque: only codecs read it.
	Extra string
}

// Summary replaces a range of earlier messages after compaction. From and To
// are indexes into the persisted log (To exclusive).
type Summary struct {
	Text string
	From int
	To   int
}

// Marker stands where an image or document was removed, so the text keeps its
// meaning (the caption) and says why (the reason code).
type Marker struct {
	Of        string // "image" or "document"
	MediaType string // already sanitised by whoever made the marker
	Ref       blob.Ref
	Caption   string
	Reason    string // a reason.Code
	// Handle, when recall is on, names the image for the recall tool
	// within its conversation ("" when off: the marker says nothing of it).
	Handle string
}

// RecallTool is the name of the tool a marker's handle is passed to.
const RecallTool = "imgctx_recall"

// Opaque is a part imgctx does not manage — a thinking block with its
// signature, a server-tool block, an audio part, a block type a provider
// adds next month — kept as the raw JSON of its wire, so it passes through
// byte for byte. An encoder for another wire leaves it out.
type Opaque struct {
	Wire string // "openai", "anthropic", …
	Raw  string // the part's JSON as it came
}

func (Text) Kind() string       { return "text" }
func (Image) Kind() string      { return "image" }
func (Document) Kind() string   { return "document" }
func (ToolCall) Kind() string   { return "tool_call" }
func (ToolResult) Kind() string { return "tool_result" }
func (Summary) Kind() string    { return "summary" }
func (Marker) Kind() string     { return "marker" }
func (Opaque) Kind() string     { return "opaque" }

func (Text) part()       {}
func (Image) part()      {}
func (Document) part()   {}
func (ToolCall) part()   {}
func (ToolResult) part() {}
func (Summary) part()    {}
func (Marker) part()     {}
func (Opaque) part()     {}

// MarkerFor returns the marker that stands where p, an Image or a Document,
// is removed for reason (a reason.Code): its caption is kept and its MIME
// type sanitised, since MIME strings from tools are untrusted. ok is false
// for other parts.
func MarkerFor(p Part, reason string) (m Marker, ok bool) {
	switch p := p.(type) {
	case Image:
		return Marker{Of: "image", MediaType: safeMIME(p.MediaType), Ref: p.Ref, Caption: p.Caption, Reason: reason}, true
	case Document:
		return Marker{Of: "document", MediaType: safeMIME(p.MediaType), Ref: p.Ref, Caption: p.Caption, Reason: reason}, true
	}
	return Marker{}, false
}

func safeMIME(s string) string {
	if s == "" {
		return ""
	}
	return mimetype.Sanitize(s)
}

// String renders the marker as the text a model reads in place of the media.
// An image's MIME type is left out, and so is a reason that removed what the
// model has seen (reason.Code.Unseen): they tell the model nothing, and a
// marker is read again on every later request.
func (m Marker) String() string {
	s := "[" + m.Of + " removed"
	if m.MediaType != "" && m.Of != "image" {
		s += ": " + m.MediaType
	}
	if m.Caption != "" {
		s += " — " + m.Caption
	}
	if m.ShowsReason() {
		s += " (" + m.Reason + ")"
	}
	if m.Handle != "" {
		s += recallPrefix + m.Handle + recallSuffix
	}
	return s + "]"
}

// ShowsReason reports whether the marker's text names its reason: only a
// reason the model was never shown the media for (reason.Code.Unseen).
func (m Marker) ShowsReason() bool { return reason.Code(m.Reason).Unseen() }

const recallPrefix, recallSuffix = " — recall with " + RecallTool + `("`, `")`

// RecallChars is what a handle adds to a marker's text, in runes.
func RecallChars(handle string) int {
	if handle == "" {
		return 0
	}
	return utf8.RuneCountInString(recallPrefix+recallSuffix) + len(handle)
}

// CloneMessages returns a deep copy of msgs.
func CloneMessages(msgs []Message) []Message {
	if msgs == nil {
		return nil
	}
	out := make([]Message, len(msgs))
	for i, m := range msgs {
		out[i] = m.Clone()
	}
	return out
}

// Equal reports whether a and b are the same message: they encode to the
// same JSON. It is cheap where b is a's clone (their strings share bytes),
// so a caller can tell which messages of a history changed.
func Equal(a, b Message) bool {
	if a.Role != b.Role || a.Wire != b.Wire || len(a.Extra) != len(b.Extra) {
		return false
	}
	for k, v := range a.Extra {
		if w, ok := b.Extra[k]; !ok || !bytes.Equal(v, w) {
			return false
		}
	}
	return equalParts(a.Parts, b.Parts)
}

func equalParts(a, b []Part) bool {
	if len(a) != len(b) || (a == nil) != (b == nil) {
		return false
	}
	for i := range a {
		ra, aok := a[i].(ToolResult)
		rb, bok := b[i].(ToolResult)
		switch {
		case aok != bok:
			return false
		case aok:
			if ra.CallID != rb.CallID || ra.Name != rb.Name || ra.IsError != rb.IsError || ra.Extra != rb.Extra || !equalParts(ra.Parts, rb.Parts) {
				return false
			}
		case a[i] != b[i]: // every other part is a comparable struct
			return false
		}
	}
	return true
}

// Clone returns a deep copy of the message.
func (m Message) Clone() Message {
	m.Parts = cloneParts(m.Parts)
	if m.Extra != nil {
		extra := make(map[string]json.RawMessage, len(m.Extra))
		for k, v := range m.Extra {
			extra[k] = append(json.RawMessage(nil), v...)
		}
		m.Extra = extra
	}
	return m
}

func cloneParts(ps []Part) []Part {
	if ps == nil {
		return nil
	}
	out := make([]Part, len(ps))
	for i, p := range ps {
		if tr, ok := p.(ToolResult); ok {
			tr.Parts = cloneParts(tr.Parts)
			p = tr
		}
		out[i] = p
	}
	return out
}

// Walk calls fn for every part of parts in order, descending into tool
// results after visiting them. depth is 0 for top-level parts. Walk stops
// early, returning false, when fn returns false.
func Walk(parts []Part, fn func(p Part, depth int) bool) bool {
	return walk(parts, 0, fn)
}

func walk(parts []Part, depth int, fn func(Part, int) bool) bool {
	for _, p := range parts {
		if !fn(p, depth) {
			return false
		}
		if tr, ok := p.(ToolResult); ok {
			if !walk(tr.Parts, depth+1, fn) {
				return false
			}
		}
	}
	return true
}

// HasImage reports whether parts, or a tool result among them, hold an
// image. A tight loop with no callback: the engine's passes over a long
// history ask it of every message to skip the many that hold none.
func HasImage(parts []Part) bool {
	for _, p := range parts {
		switch p := p.(type) {
		case Image:
			return true
		case ToolResult:
			if HasImage(p.Parts) {
				return true
			}
		}
	}
	return false
}

// Imaged returns the indices of the messages of msgs that hold an image,
// in order. It walks back from the last message and steps over the runs a
// scan marked as holding none (Message.ImagelessBefore), so on an agent's
// long history, mostly text, it reads the few messages that matter. msgs
// may be part of a longer history: a step past its start ends the walk.
func Imaged(msgs []Message) []int {
	var at []int
	for i := len(msgs) - 1; i >= 0; i -= 1 + msgs[i].ImagelessBefore {
		if HasImage(msgs[i].Parts) {
			at = append(at, i)
		}
	}
	slices.Reverse(at)
	return at
}

// LinkImageless sets msgs[i].ImagelessBefore from the message before it:
// a scan calls it on each message it reads, in order.
func LinkImageless(msgs []Message, i int) {
	msgs[i].ImagelessBefore = 0
	if i > 0 && !HasImage(msgs[i-1].Parts) {
		msgs[i].ImagelessBefore = 1 + msgs[i-1].ImagelessBefore
	}
}

// Unlink forgets what a scan marked on msgs (ImagelessBefore), for
// messages that do not stand after the ones they stood after when read.
func Unlink(msgs []Message) {
	for i := range msgs {
		msgs[i].ImagelessBefore = 0
	}
}

// Images returns every image of the message, nested ones included, in order.
func (m Message) Images() []Image {
	if !HasImage(m.Parts) {
		return nil
	}
	var out []Image
	Walk(m.Parts, func(p Part, _ int) bool {
		if im, ok := p.(Image); ok {
			out = append(out, im)
		}
		return true
	})
	return out
}

// TextContent joins the message's top-level text parts with newlines.
func (m Message) TextContent() string {
	var s string
	for _, p := range m.Parts {
		if t, ok := p.(Text); ok {
			if s != "" {
				s += "\n"
			}
			s += t.Text
		}
	}
	return s
}

// Usage is what the engine reported for one request, normalised across
// providers: Prompt is every input token (cached ones included; Anthropic's
// three input fields summed), CacheRead and CacheWrite are the parts of it
// read from and written to the prompt cache.
type Usage struct {
	Prompt     int `json:"prompt"`
	CacheRead  int `json:"cache_read,omitempty"`
	CacheWrite int `json:"cache_write,omitempty"`
	// CacheWriteHour is the part of CacheWrite written to keep for an
	// hour, at its own price (Anthropic's "ttl": "1h").
	CacheWriteHour int `json:"cache_write_1h,omitempty"`
	Output         int `json:"output"`
}

// RelaysTool reports whether msgs[i] is a user message relaying what a
// tool returned: it comes right after a tool message, or after another such
// relay. That is the OpenAI Chat Completions shape of a tool that returned
// a screenshot, since a tool message holds text only — the images alone,
// beside a text part ("Attached media from tool result:", qwen-code), or
// split over several messages. Its images are the tool's, and it does not
// start a turn. A human's message follows the assistant's, never a tool's.
func RelaysTool(msgs []Message, i int) bool {
	if i <= 0 || i >= len(msgs) || msgs[i].Role != User {
		return false
	}
	for _, p := range msgs[i].Parts {
		if _, ok := p.(ToolResult); ok {
			return false
		}
	}
	return msgs[i-1].Role == Tool || RelaysTool(msgs, i-1)
}
