package wire

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Spliced is a client request read in place: its bytes as they came, a
// view of its messages for the policies, and the parts imgctx manages
// (images and documents) as slots with their spans. Sending it copies every
// byte outside the slots that change, so block types, roles, fields and
// formatting imgctx does not manage reach the upstream unchanged; only the
// image and document parts it stores, expands or removes are rewritten.
type Spliced struct {
	Body   []byte
	Model  string
	Stream bool
	// Messages is the view: one per wire message, in order. A managed part
	// is a zero chat.Image or chat.Document at its slot's Pos until the
	// caller fills it in; everything else is a chat.Opaque of the wire
	// without its bytes — the body has them — (a tool result a
	// chat.ToolResult holding its own parts the same way). Nothing in the
	// view or the slots points into the body, so a scan can outlive it.
	Messages []chat.Message
	Slots    []Slot
	// End is the offset of the top-level object's closing brace, where a
	// member can be added.
	End int
	// Top holds the spans of the top-level members, by name.
	Top map[string]Span
	// Marks are the messages' extents and hashes, for the next scan
	// (Resume); Resumed is how many messages this scan took over from the
	// previous one.
	Marks   []Mark
	Resumed int
	// Extends: the scan took the previous one's views over whole and
	// appends to them in place. Only one scan of a Resume does, so what
	// its caller built on that request's views it may extend the same way.
	Extends    bool
	prev       *Resume
	limits     ScanOptions
	compaction bool // the message being scanned holds a compaction block
	parts      int
	// Found, when set, is called with each slot as the scan reads it, so
	// the caller can start work on it (hashing its base64) while the scan
	// goes on. Its Pos may still change (an OpenAI tool message's slots move
	// into the tool result once the message is read).
	Found func(Slot)
}

// Compaction notes that the message being scanned holds a provider
// compaction block: the provider ignores what comes before it.
func (s *Spliced) Compaction() { s.compaction = true }

// Compacted is the index of the last message holding a compaction block,
// 0 when none: images before it are not sent.
func (s *Spliced) Compacted() int {
	for i := len(s.Marks) - 1; i > 0; i-- {
		if s.Marks[i].Compaction {
			return i
		}
	}
	return 0
}

// Add appends a slot and reports it to Found.
func (s *Spliced) Add(slot Slot) {
	s.Slots = append(s.Slots, slot)
	if s.Found != nil {
		s.Found(slot)
	}
}

// Span is a value's bytes in the body: Body[Start:End].
type Span struct{ Start, End int }

// Pos says where a slot's part sits in the view: Messages[Msg].Parts[Part],
// and inside that tool result's Parts[Nested] when Nested >= 0.
type Pos struct{ Msg, Part, Nested int }

// Slot is one managed part of the request.
type Slot struct {
	Pos  Pos
	Part Span // the part's JSON object
	// Source is the span to rewrite when the part is sent with other bytes
	// (an expanded ref, a shrunk copy): the OpenAI url string, the
	// Anthropic source object.
	Source Span
	Kind   string // "image" or "document"
	// How the client sent it: "base64" (inline), "ref" (imgctx:sha256-…),
	// "url" (http or https).
	Via       string
	MediaType string
	// Data is the inline base64 in the body: the bytes between the JSON
	// string's quotes, so it may hold JSON escapes ("\/"), which whoever
	// decodes it undoes.
	Data   Span
	URL    string // for "ref" and "url"
	Detail string // OpenAI's detail hint
	// Cache is the raw cache_control of an Anthropic block (empty if none),
	// kept on the marker that replaces it so a client breakpoint survives.
	Cache Span
}

// Of returns the bytes of sp in body (nil for an empty span).
func (sp Span) Of(body []byte) []byte {
	if sp.End <= sp.Start {
		return nil
	}
	return body[sp.Start:sp.End]
}

// Resume is what a scan leaves for the next scan of the same conversation.
// Agents re-send the whole history with a few messages appended: a scan
// given the previous one's Resume takes over the leading messages whose
// bytes are the same — compared with the previous request's own bytes,
// which the Resume holds up to its last message, so nothing a client
// sends can pass for what it did not send — and reads only the rest. The
// result is exactly a full scan's: a test holds it to that.
type Resume struct {
	// Body is the previous request up to the end of its last message: its
	// own memory, which whoever holds the Resume keeps unchanged.
	Body     []byte
	Messages []chat.Message
	Slots    []Slot
	Marks    []Mark
	// extended: a scan took the views over whole and appends to them in
	// place (beyond their length, which nothing that holds r reads); any
	// other scan copies what it takes.
	extended atomic.Bool
}

// Mark is one message: its extent, the slots before it, and whether it
// holds a provider compaction block.
type Mark struct {
	Start, End, Slots int
	Compaction        bool
}

// Resume returns what the next scan of this conversation can take over.
func (s *Spliced) Resume() *Resume {
	r := &Resume{Messages: s.Messages, Slots: s.Slots, Marks: s.Marks}
	if len(s.Marks) > 0 {
		r.Body = s.Body[:s.Marks[len(s.Marks)-1].End]
	}
	return r
}

// Bytes is what the Resume holds of the request's bytes.
func (r *Resume) Bytes() int { return len(r.Body) }

// shared counts r's leading messages that stand in body at the same
// offsets with the same bytes, and everything before them the same: the
// messages that end within the bytes body and the previous request share.
// The first known bytes were found equal already, as the body arrived.
func (r *Resume) shared(body []byte, known int) int {
	n := known + CommonPrefix(r.Body[min(known, len(r.Body)):], body[min(known, len(body)):])
	return sort.Search(len(r.Marks), func(j int) bool { return r.Marks[j].End > n })
}

// CommonPrefix is how many leading bytes a and b share: a memory compare,
// a page at a time.
func CommonPrefix(a, b []byte) int {
	n := min(len(a), len(b))
	const page = 4096
	i := 0
	for i+page <= n && bytes.Equal(a[i:i+page], b[i:i+page]) {
		i += page
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// WalkMessages walks the messages array at b[at], calling element at each
// message's start and marking each message for the next scan. With a
// previous scan (ScanRequest given a Resume), the leading messages it
// shares are taken from it and the walk goes on after them.
func WalkMessages(s *Spliced, at int, element func(vs int) (int, error)) (int, error) {
	b := s.Body
	if at >= len(b) || b[at] != '[' {
		return at, fmt.Errorf("messages: not an array")
	}
	from := 0
	if p := s.prev; p != nil {
		if n := p.shared(b, s.limits.Known); n > 0 {
			if n == len(p.Marks) && p.extended.CompareAndSwap(false, true) {
				// The whole previous request, extended: the first scan to
				// do so appends in place, past what p's readers read; the
				// history is not copied.
				s.Messages, s.Slots, s.Marks = p.Messages, p.Slots, p.Marks
				s.Extends = true
			} else {
				s.Messages = append(s.Messages[:0:0], p.Messages[:n]...)
				s.Slots = append(s.Slots[:0:0], p.Slots[:slotsUpTo(p, n)]...)
				s.Marks = append(s.Marks[:0:0], p.Marks[:n]...)
			}
			s.Resumed = n
			from = p.Marks[n-1].End
		}
	}
	return jsonspan.ArrayFrom(b, at, from, func(vs int) (int, error) {
		if len(s.Marks) >= s.limits.maxMessages() {
			return vs, &TooMany{What: "messages", Limit: s.limits.maxMessages()}
		}
		slots, read := len(s.Slots), len(s.Messages)
		s.compaction = false
		ve, err := element(vs)
		if err == nil {
			s.Marks = append(s.Marks, Mark{Start: vs, End: ve, Slots: slots, Compaction: s.compaction})
			for i := read; i < len(s.Messages); i++ {
				chat.LinkImageless(s.Messages, i)
			}
		}
		return ve, err
	})
}

// slotsUpTo is how many of r's slots lie in its first n messages.
func slotsUpTo(r *Resume, n int) int {
	if n < len(r.Marks) {
		return r.Marks[n].Slots
	}
	return len(r.Slots)
}

// ScanOptions tune a scan. The zero value scans with no previous scan,
// no hook and the default limits.
type ScanOptions struct {
	Prev *Resume // the conversation's previous scan, to resume from
	// Known is how many leading bytes of the body were found equal to
	// Prev's already (compared as they arrived): the scan compares from
	// there. It must not count a byte that differs.
	Known int
	Found func(Slot) // called with each slot as it is read
	// MaxMessages and MaxParts bound what one request may hold (a body of a
	// million one-letter messages costs far more to hold than to send);
	// past them the scan fails with a *TooMany. Defaults 10,000 and 50,000.
	MaxMessages, MaxParts int
}

// TooMany is the refusal of a request over a scan limit.
type TooMany struct {
	What  string // "messages" or "parts"
	Limit int
}

func (e *TooMany) Error() string {
	return fmt.Sprintf("more than %d %s in one request", e.Limit, e.What)
}

func (o ScanOptions) maxMessages() int {
	if o.MaxMessages > 0 {
		return o.MaxMessages
	}
	return 10_000
}

func (o ScanOptions) maxParts() int {
	if o.MaxParts > 0 {
		return o.MaxParts
	}
	return 50_000
}

// Part counts one more part of the request against the limit.
func (s *Spliced) Part() error {
	if s.parts++; s.parts > s.limits.maxParts() {
		return &TooMany{What: "parts", Limit: s.limits.maxParts()}
	}
	return nil
}

// ScanRequest reads a request body's top level in place: the spans of its
// members, the model and stream flag, and its messages array through the
// wire's own messages reader (which fills in the view and the slots). The
// managed members (messages among them) are guarded against smuggling.
func ScanRequest(body []byte, o ScanOptions, messages func(s *Spliced, at int) (int, error), managed ...string) (*Spliced, error) {
	s, err := ScanList(body, o, "messages", messages, managed...)
	if err == nil {
		if _, ok := s.Top["messages"]; !ok {
			return nil, fmt.Errorf("request has no messages")
		}
	}
	return s, err
}

// ScanList is ScanRequest for a wire whose conversation is the top-level
// member list (OpenAI Responses: "input"), which may be absent.
func ScanList(body []byte, o ScanOptions, list string, messages func(s *Spliced, at int) (int, error), managed ...string) (*Spliced, error) {
	s := &Spliced{Body: body, Top: map[string]Span{}, Found: o.Found, prev: o.Prev, limits: o}
	start := jsonspan.Skip(body, 0)
	if start >= len(body) || body[start] != '{' {
		return nil, fmt.Errorf("request body: not a JSON object")
	}
	top := NewKeys(managed...)
	end, err := jsonspan.Object(body, start, func(key []byte, vs int) (int, error) {
		if err := top.Check(key); err != nil {
			return vs, err
		}
		var ve int
		var err error
		if string(key) == list {
			ve, err = messages(s, vs)
		} else {
			ve, err = jsonspan.End(body, vs)
		}
		if err != nil {
			return ve, err
		}
		s.Top[string(key)] = Span{Start: vs, End: ve}
		switch string(key) {
		case "model":
			s.Model, _ = jsonspan.String(body, vs, ve)
		case "stream":
			s.Stream = string(body[vs:ve]) == "true"
		}
		return ve, nil
	})
	if err != nil {
		return nil, fmt.Errorf("request body: %w", err)
	}
	if jsonspan.Skip(body, end) != len(body) {
		return nil, fmt.Errorf("request body: trailing data after the JSON object")
	}
	s.End = end - 1
	return s, nil
}

// ScanParts reads a content value at Body[at] the way every wire lays one
// out: a string (or any other non-array) is one part, opaque; an array
// gives a part per element, each read by part at its place. pos is the
// first part's place; its Part index grows with each element, or its
// Nested index when pos is inside a tool result. name labels errors.
func ScanParts(s *Spliced, at int, pos Pos, name string, opaque chat.Part, part func(at int, pos Pos) (chat.Part, int, error)) ([]chat.Part, int, error) {
	b := s.Body
	if b[at] != '[' {
		end, err := jsonspan.End(b, at)
		return []chat.Part{opaque}, end, err
	}
	var parts []chat.Part
	end, err := jsonspan.Array(b, at, func(vs int) (int, error) {
		if err := s.Part(); err != nil {
			return vs, err
		}
		p := pos
		if p.Nested >= 0 {
			p.Nested = len(parts)
		} else {
			p.Part = len(parts)
		}
		pt, ve, err := part(vs, p)
		if err != nil {
			return ve, fmt.Errorf("%s[%d]: %w", name, len(parts), err)
		}
		parts = append(parts, pt)
		return ve, nil
	})
	return parts, end, err
}

// URLSlot reads the JSON string at u holding an image's or a file's URL,
// in place: a data URL's base64 becomes the slot's Data (decoding checks
// it later), any other URL its URL (an imgctx: ref by ref). ok is false
// when u is not a string.
func URLSlot(b []byte, u Span) (slot Slot, ok bool, err error) {
	if u.End-u.Start < 2 || b[u.Start] != '"' {
		return Slot{}, false, nil
	}
	slot.Source = u
	raw := b[u.Start+1 : u.End-1] // megabytes of a data URL, used as they stand
	head := raw[:min(len(raw), 256)]
	if k := bytes.Index(head, []byte(";base64,")); k > 5 && bytes.HasPrefix(bytes.ToLower(head[:5]), []byte("data:")) {
		mt := strings.ReplaceAll(string(head[5:k]), `\/`, "/")
		if semi := strings.IndexByte(mt, ';'); semi >= 0 {
			mt = mt[:semi]
		}
		slot.Via, slot.MediaType = "base64", mt
		slot.Data = Span{Start: u.Start + 1 + k + len(";base64,"), End: u.End - 1}
		// Decoding checks the base64, not what precedes it: the "data:…;"
		// head goes upstream as it came, so it gets the check here (a
		// control byte in the media type is invalid JSON).
		head := append(append([]byte(nil), b[u.Start:slot.Data.Start]...), '"')
		if err := jsonspan.Check(head, 0, len(head)); err != nil {
			return Slot{}, false, fmt.Errorf("invalid data URL at byte %d: %w", u.Start, err)
		}
		return slot, true, nil
	}
	if err := jsonspan.Check(b, u.Start, u.End); err != nil {
		return Slot{}, false, err
	}
	s, ok := jsonspan.String(b, u.Start, u.End)
	if !ok {
		return Slot{}, false, fmt.Errorf("invalid JSON string at byte %d", u.Start)
	}
	slot.URL, slot.Via = s, "url"
	if strings.HasPrefix(slot.URL, "imgctx:") {
		slot.Via = "ref"
	}
	return slot, true, nil
}

// At returns the part at pos in msgs.
func At(msgs []chat.Message, pos Pos) chat.Part {
	if pos.Msg >= len(msgs) || pos.Part >= len(msgs[pos.Msg].Parts) {
		return nil
	}
	p := msgs[pos.Msg].Parts[pos.Part]
	if pos.Nested < 0 {
		return p
	}
	tr, ok := p.(chat.ToolResult)
	if !ok || pos.Nested >= len(tr.Parts) {
		return nil
	}
	return tr.Parts[pos.Nested]
}

// Put sets the part at pos in msgs, which the caller owns.
func Put(msgs []chat.Message, pos Pos, part chat.Part) {
	if pos.Nested < 0 {
		msgs[pos.Msg].Parts[pos.Part] = part
		return
	}
	tr := msgs[pos.Msg].Parts[pos.Part].(chat.ToolResult)
	tr.Parts[pos.Nested] = part
	msgs[pos.Msg].Parts[pos.Part] = tr
}

// Edit replaces Body[Start:End] with what Write writes.
type Edit struct {
	Start, End int
	Write      func(w *BodyWriter)
}

// Splice writes body with edits applied, in order of Start; edits must not
// overlap. Unchanged runs are pieces of body itself, not copies.
func Splice(body []byte, edits []Edit) (Body, error) {
	slices.SortFunc(edits, func(a, b Edit) int { return a.Start - b.Start })
	w := BodyWriter{body: Body{pieces: make([]piece, 0, 2*len(edits)+1)}} // a run and an edit each
	last := 0
	for _, e := range edits {
		if e.Start < last || e.End < e.Start || e.End > len(body) {
			return Body{}, fmt.Errorf("splice: edit %d..%d overlaps or leaves the body", e.Start, e.End)
		}
		w.Slice(body[last:e.Start])
		e.Write(&w)
		last = e.End
	}
	w.Slice(body[last:])
	return w.Body(), nil
}

// Quote returns s as a JSON string without HTML escaping: text written by
// imgctx (markers, notes) must not turn a client's "<" into "\u003c".
func Quote(s string) []byte {
	if plainString(s) {
		b := make([]byte, 0, len(s)+2)
		return append(append(append(b, '"'), s...), '"')
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s) // a string always encodes
	return bytes.TrimRight(buf.Bytes(), "\n")
}

// Marshal is json.Marshal without HTML escaping.
func Marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

// DecodeMember decodes the top-level member key of the JSON object b into
// v, reporting whether it was there and decoded.
func DecodeMember(b []byte, key string, v any) bool {
	raw, ok := Member(b, key)
	return ok && json.Unmarshal(raw, v) == nil
}

// Member returns the raw value of the top-level member key of the JSON
// object b, found with one pass and nothing decoded (a response's usage,
// say, without decoding the completion around it).
func Member(b []byte, key string) ([]byte, bool) {
	var out [1][]byte
	ok := Members(b, []string{key}, out[:])
	return out[0], ok && out[0] != nil
}

// Members is Member for several keys in the same one pass: out[i] is the
// raw value of keys[i] (its first), nil when absent. ok is false when b
// is not a valid JSON object.
func Members(b []byte, keys []string, out [][]byte) bool {
	start := jsonspan.Skip(b, 0)
	if start >= len(b) || b[start] != '{' {
		return false
	}
	_, err := jsonspan.Object(b, start, func(k []byte, vs int) (int, error) {
		ve, err := jsonspan.End(b, vs)
		if err == nil {
			for i, key := range keys {
				if out[i] == nil && string(k) == key {
					out[i] = b[vs:ve]
				}
			}
		}
		return ve, err
	})
	return err == nil
}

// Ints reads the integer members of the JSON object b that keys name (a
// nested object's as "outer.inner") into the matching elements of out, in
// one pass and without reflection: a response's usage, read on every
// request. ok is false wherever encoding/json might read b otherwise — a
// key escaped or matching one of keys only in another case, a value that
// is not a plain non-negative integer or null where keys names a number,
// an object given as anything but an object — for the caller to decode b
// with encoding/json instead. As there, a later duplicate wins.
func Ints(b []byte, keys []string, out []int) bool {
	return ints(b, "", keys, out)
}

func ints(b []byte, outer string, keys []string, out []int) bool {
	start := jsonspan.Skip(b, 0)
	if start >= len(b) || b[start] != '{' {
		return false
	}
	ok := true
	end, err := jsonspan.Object(b, start, func(k []byte, vs int) (int, error) {
		ve, err := jsonspan.End(b, vs)
		if err != nil || !ok {
			return ve, err
		}
		if bytes.IndexByte(k, '\\') >= 0 {
			ok = false
			return ve, nil
		}
		for i, key := range keys {
			rest, found := strings.CutPrefix(key, outer)
			if !found {
				continue
			}
			name, _, nested := strings.Cut(rest, ".")
			if string(k) != name {
				if strings.EqualFold(string(k), name) {
					ok = false
				}
				continue
			}
			if nested {
				ok = b[vs] == '{' && ints(b[vs:ve], outer+name+".", keys, out)
				return ve, nil // every key under it read at once
			}
			if n, isInt := plainInt(b[vs:ve]); isInt {
				out[i] = n
			} else if string(b[vs:ve]) != "null" {
				ok = false
			}
			return ve, nil
		}
		return ve, nil
	})
	return err == nil && ok && jsonspan.Skip(b, end) == len(b)
}

// plainInt reads a JSON integer with no sign, fraction or exponent, short
// enough not to overflow.
func plainInt(b []byte) (int, bool) {
	if len(b) == 0 || len(b) > 18 || len(b) > 1 && b[0] == '0' {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// Keys guards the members of one object against smuggling: a key imgctx
// reads given twice, or given again in another case, is refused — an
// upstream decoder that matches keys without case, or keeps the last of
// two, would act on a copy imgctx never looked at (an image URL past the
// SSRF guard, an image past the budget). Use a fresh Keys per object.
type Keys struct {
	managed []string
	seen    uint64
}

// NewKeys guards the given keys (at most 64).
func NewKeys(managed ...string) Keys { return Keys{managed: managed} }

// Check returns an error if key repeats or case-folds onto a managed key
// (Unicode simple folding, as encoding/json matches fields). key is the
// member's name with its escapes undone.
func (k *Keys) Check(key []byte) error {
	wide := false // a byte past ASCII: Unicode folding may change the length
	for _, c := range key {
		wide = wide || c >= 0x80
	}
	for i, m := range k.managed {
		// encoding/json, which Go upstreams (Ollama) decode with, matches
		// members to fields with Unicode simple folding: "meſſages" (U+017F)
		// and KELVIN SIGN for "k" too.
		if len(key) != len(m) && !wide || !bytes.EqualFold(key, []byte(m)) {
			continue
		}
		if string(key) != m {
			return fmt.Errorf("member %q differs from %q only in case: refused, an upstream may read it as %q", key, m, m)
		}
		if k.seen&(1<<i) != 0 {
			return fmt.Errorf("member %q appears twice: refused, an upstream may read either", key)
		}
		k.seen |= 1 << i
	}
	return nil
}
