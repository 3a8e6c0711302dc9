// Package sim replays image-heavy agent workloads against an emulated
// provider that counts and bills like the real ones, under several image
// policies side by side (imgctx simulate). The imgctx rows run through the
// gateway's own handler and engine; the provider is reached through the
// same upstream client the gateway uses, over an in-memory transport.
package sim

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/tokens"
)

// Clock is the simulated time: think time and idle gaps advance it, so
// cache TTLs expire as they would.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock starts a clock at a fixed date.
func NewClock() *Clock { return &Clock{t: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)} }

// Now returns the simulated time.
func (c *Clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

// Advance moves the clock forward.
func (c *Clock) Advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// Bill is what the provider charged (or refused) for one request.
type Bill struct {
	Kind         string // "main" or "summary" (X-Sim-Kind)
	Failed       string // "" or why the provider refused: overflow, images, bytes
	Prompt       int    // prompt tokens, all of them
	Input        int    // billed at the input price (after the last breakpoint, or uncached)
	CacheRead    int
	CacheWrite   int // 5-minute writes
	CacheWrite1h int
	Output       int
	Bytes        int      // the request body
	Images       int      // image blocks the request carried
	Pages        int      // PDF pages it carried
	Keys         []string // imageKey of each image it carried
	Break        bool
	BreakCause   string // "image", "expired" (the previous prompt had left the cache) or "other", when Break
	Rewritten    int    // cache-write tokens that re-wrote what the previous request had cached, when Break
	blocks       []block
}

// block is one content block of a prompt, in order, as the provider
// caches it: its canonical hash (cache_control left out), its tokens, and
// whether it carries an image.
type block struct {
	hash   [32]byte
	tokens int
	images int
	bp     bool          // a cache_control breakpoint
	ttl    time.Duration // of the breakpoint
	edge   int           // the longest edge of its images, pixels
	size   int           // the largest of its images, base64 bytes
	pages  int           // PDF pages
	keys   []string      // its images' imageKey
}

// imageKey names an image by its data's head and length: what the
// recency measure needs to tell which screenshots a request carried.
func imageKey(b64 string, n int) string {
	head := b64[:min(len(b64), 4096)]
	sum := sha256.Sum256([]byte(head))
	return fmt.Sprintf("%x:%d", sum[:8], n)
}

// Provider is an in-memory model server speaking Anthropic Messages
// (/v1/messages), OpenAI Chat Completions (/v1/chat/completions) and
// Responses (/v1/responses), and Gemini generateContent as their API
// references document them: token counting with the profile's
// tokenizer and image rule, prompt caching (Anthropic breakpoints, OpenAI
// automatic prefixes), usage in each provider's own fields, and the errors
// for prompts past the window and the image limits.
type Provider struct {
	Profile tokens.Profile
	Clock   *Clock
	// Output is the output tokens of a normal answer; SummaryOutput of an
	// answer to a request marked X-Sim-Kind: summary.
	Output, SummaryOutput int
	// Received, when set, sees each request body as it arrived.
	Received func(body []byte)

	mu     sync.Mutex
	cache  map[[32]byte]*entry // prefix hash → cached prefix
	bills  []Bill
	last   []block  // the previous main request's blocks, for prefix breaks
	lastAt [32]byte // the prefix hash under which the previous one was cached
	counts *Counts
	seq    int
	prev   []seen // the previous request's messages
	bufs   [2]bytes.Buffer
	reads  int
	// files are the Files API's: base64 data by id, an id naming its
	// content (so a memoised message names the same image in every run);
	// uploaded their bytes as sent, sessions Gemini's open uploads.
	files    map[string]string
	uploaded int64
	sessions map[string]string
}

type entry struct {
	expires, written time.Time
	ttl              time.Duration
}

// Counts memoises what blocks hash to and cost, across providers (and
// policies) of one profile: a workload's blocks are read once.
type Counts struct {
	mu   sync.Mutex
	m    map[[32]byte]block
	msgs map[[32]byte][]block // a whole message's blocks, by its bytes
}

// message returns the blocks of one message read from raw, reading them
// the first time only: a re-sent history costs a hash per message.
func (p *Provider) message(api string, raw json.RawMessage, read func() ([]block, error)) ([]block, error) {
	return remember(&p.counts.mu, &p.counts.msgs, hashOf(api, raw), read)
}

// remember returns m[h], computing and storing it the first time.
func remember[V any](mu *sync.Mutex, m *map[[32]byte]V, h [32]byte, read func() (V, error)) (V, error) {
	mu.Lock()
	v, ok := (*m)[h]
	mu.Unlock()
	if ok {
		return v, nil
	}
	v, err := read()
	if err != nil {
		return v, err
	}
	mu.Lock()
	if *m == nil {
		*m = map[[32]byte]V{}
	}
	(*m)[h] = v
	mu.Unlock()
	return v, nil
}

// NewProvider returns a provider for the profile on the clock; counts may
// be shared between providers of one profile.
func NewProvider(p tokens.Profile, c *Clock, counts *Counts) *Provider {
	if counts == nil {
		counts = &Counts{}
	}
	return &Provider{Profile: p, Clock: c, Output: 120, SummaryOutput: 2000, cache: map[[32]byte]*entry{}, counts: counts}
}

// Bills returns what the provider billed so far, in order.
func (p *Provider) Bills() []Bill {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Bill(nil), p.bills...)
}

// Transport reaches the provider in memory: an http.Client with it talks
// to the provider exactly as over the network.
func (p *Provider) Transport() http.RoundTripper { return handlerTransport{p} }

type handlerTransport struct{ h http.Handler }

// RoundTrip closes the request's body, as the RoundTripper contract asks:
// the gateway recycles a body's buffer only once its readers are closed.
func (t handlerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, r)
	if r.Body != nil {
		r.Body.Close()
	}
	return rec.Result(), nil
}

// ServeHTTP answers one request.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.filesAPI(w, r) {
		return
	}
	// Two buffers in turn: the previous body stays readable (p.prev).
	p.reads++
	buf := &p.bufs[p.reads%2]
	buf.Reset()
	if r.ContentLength > 0 {
		buf.Grow(int(r.ContentLength))
	}
	if _, err := buf.ReadFrom(r.Body); err != nil {
		// Not a request: its client went away before the body's end (a
		// gateway's request abandoned for another, upstream.Early). Nothing
		// answered, nothing billed, the previous body kept.
		p.reads--
		return
	}
	body := buf.Bytes()
	if p.Received != nil {
		p.Received(body)
	}
	kind := r.Header.Get("X-Sim-Kind")
	if kind == "" {
		kind = "main"
	}
	var api string
	switch path := r.URL.Path; {
	case strings.HasSuffix(path, "/v1/messages"):
		api = "anthropic"
	case strings.HasSuffix(path, "/v1/chat/completions"):
		api = "openai"
	case strings.HasSuffix(path, "/v1/responses"):
		api = "responses"
	case strings.Contains(path, "/v1beta/models/") && strings.HasSuffix(path, ":generateContent"):
		api = "gemini"
	default:
		http.Error(w, "not found", 404)
		return
	}
	blocks, err := p.blocks(api, body)
	if err != nil {
		p.refuseLocked(w, api, 400, "invalid_request_error", err.Error(), Bill{Kind: kind, Failed: "invalid", Bytes: len(body)})
		return
	}
	bill := Bill{Kind: kind, Bytes: len(body), blocks: blocks}
	for _, b := range blocks {
		bill.Prompt += b.tokens
		bill.Images += b.images
		bill.Pages += b.pages
		bill.Keys = append(bill.Keys, b.keys...)
	}
	lim := p.Profile.Limits
	switch {
	case lim.MaxRequestBytes > 0 && int64(len(body)) > lim.MaxRequestBytes:
		bill.Failed = "bytes"
		p.refuseLocked(w, api, 413, "request_too_large", fmt.Sprintf("Request exceeds the maximum allowed number of bytes: %d > %d", len(body), lim.MaxRequestBytes), bill)
		return
	case lim.MaxImages > 0 && bill.Images+bill.Pages > lim.MaxImages:
		bill.Failed = "images"
		p.refuseLocked(w, api, 400, "invalid_request_error", fmt.Sprintf("Too much media: %d document pages + %d images > %d", bill.Pages, bill.Images, lim.MaxImages), bill)
		return
	case lim.ManyImagesAbove > 0 && bill.Images > lim.ManyImagesAbove && maxOf(blocks, func(b block) int { return b.edge }) > lim.ManyImagesMaxEdge:
		bill.Failed = "images"
		p.refuseLocked(w, api, 400, "invalid_request_error", fmt.Sprintf("At least one of the image dimensions exceed max allowed size for many-image requests: %d pixels", lim.ManyImagesMaxEdge), bill)
		return
	case lim.MaxImageBytes > 0 && int64(maxOf(blocks, func(b block) int { return b.size })) > lim.MaxImageBytes:
		bill.Failed = "images"
		n := maxOf(blocks, func(b block) int { return b.size })
		p.refuseLocked(w, api, 400, "invalid_request_error", fmt.Sprintf("image exceeds %d MB maximum: %d bytes > %d bytes", lim.MaxImageBytes>>20, n, lim.MaxImageBytes), bill)
		return
	case bill.Prompt > p.Profile.ContextWindow:
		bill.Failed = "overflow"
		msg := fmt.Sprintf("prompt is too long: %d tokens > %d maximum", bill.Prompt, p.Profile.ContextWindow)
		switch api {
		case "responses":
			msg = "Your input exceeds the context window of this model. Please adjust your input and try again."
		case "openai":
			msg = fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", p.Profile.ContextWindow, bill.Prompt)
		case "gemini":
			msg = fmt.Sprintf("The input token count (%d) exceeds the maximum number of tokens allowed (%d).", bill.Prompt, p.Profile.ContextWindow)
		}
		p.refuseLocked(w, api, 400, "invalid_request_error", msg, bill)
		return
	}
	if api == "anthropic" {
		p.anthropicCache(&bill)
	} else {
		p.prefixCache(&bill, api)
	}
	if kind == "main" {
		p.prefixBreak(&bill)
		p.last, p.lastAt = blocks, p.cachedAt(blocks, api == "anthropic")
	}
	bill.Output = p.Output
	if kind == "summary" {
		bill.Output = p.SummaryOutput
	}
	p.seq++
	bill.blocks = nil
	p.bills = append(p.bills, bill)
	w.Header().Set("Content-Type", "application/json")
	switch api {
	case "gemini":
		// usageMetadata: promptTokenCount includes the cached tokens.
		fmt.Fprintf(w, `{"candidates":[{"content":{"role":"model","parts":[{"text":"ok"}]},"finishReason":"STOP","index":0}],`+
			`"usageMetadata":{"promptTokenCount":%d,"cachedContentTokenCount":%d,"candidatesTokenCount":%d,"totalTokenCount":%d},"modelVersion":%q}`,
			bill.Prompt, bill.CacheRead, bill.Output, bill.Prompt+bill.Output, p.Profile.Name)
		return
	case "anthropic":
		fmt.Fprintf(w, `{"id":"msg_sim_%d","type":"message","role":"assistant","model":%q,"content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn","stop_sequence":null,`+
			`"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"cache_creation":{"ephemeral_5m_input_tokens":%d,"ephemeral_1h_input_tokens":%d},"output_tokens":%d}}`,
			p.seq, p.Profile.Name, bill.Input, bill.CacheWrite+bill.CacheWrite1h, bill.CacheRead, bill.CacheWrite, bill.CacheWrite1h, bill.Output)
		return
	case "responses":
		// input_tokens includes the cached ones (input_tokens_details).
		fmt.Fprintf(w, `{"id":"resp_sim_%d","object":"response","created_at":%d,"status":"completed","model":%q,`+
			`"output":[{"type":"message","id":"msg_sim_%d","status":"completed","role":"assistant","content":[{"type":"output_text","text":"ok","annotations":[]}]}],`+
			`"usage":{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d},"output_tokens":%d,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":%d}}`,
			p.seq, p.Clock.Now().Unix(), p.Profile.Name, p.seq, bill.Prompt, bill.CacheRead, bill.Output, bill.Prompt+bill.Output)
		return
	}
	fmt.Fprintf(w, `{"id":"chatcmpl-sim-%d","object":"chat.completion","created":%d,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],`+
		`"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":%d}}}`,
		p.seq, p.Clock.Now().Unix(), p.Profile.Name, bill.Prompt, bill.Output, bill.Prompt+bill.Output, bill.CacheRead)
}

// refuseLocked answers the provider's documented error shape.
func (p *Provider) refuseLocked(w http.ResponseWriter, api string, code int, typ, msg string, bill Bill) {
	bill.blocks = nil
	p.bills = append(p.bills, bill)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	var enc bytes.Buffer
	e := json.NewEncoder(&enc)
	e.SetEscapeHTML(false) // "> 100", as the providers write it
	e.Encode(msg)
	m := bytes.TrimSpace(enc.Bytes())
	if api == "gemini" {
		fmt.Fprintf(w, `{"error":{"code":%d,"message":%s,"status":%q}}`, code, m, geminiStatus(code))
		return
	}
	if api == "anthropic" {
		fmt.Fprintf(w, `{"type":"error","error":{"type":%q,"message":%s},"request_id":"req_sim"}`, typ, m)
		return
	}
	codeField := "null"
	if bill.Failed == "overflow" {
		codeField = `"context_length_exceeded"`
	}
	param := "messages"
	if api == "responses" {
		param = "input"
	}
	fmt.Fprintf(w, `{"error":{"message":%s,"type":"invalid_request_error","param":%q,"code":%s}}`, m, param, codeField)
}

// anthropicCache bills a request with explicit breakpoints: the longest
// prefix cached at a breakpoint or up to 20 blocks before one is read; the
// prompt up to each later breakpoint is written when that prefix is at
// least the model's minimum cacheable length (checked per breakpoint: a
// short system breakpoint is not cached even when the last one is);
// input_tokens is what follows the last prefix read or written. Hits
// refresh their TTL.
func (p *Provider) anthropicCache(b *Bill) {
	now := p.Clock.Now()
	prefix := prefixHashes(b.blocks)
	sums := prefixSums(b.blocks)
	read, last := -1, -1
	for i, bl := range b.blocks {
		if !bl.bp {
			continue
		}
		last = i
		for j := i; j >= 0 && j >= i-20; j-- {
			if e := p.cache[prefix[j]]; e != nil && now.Before(e.expires) {
				if j > read {
					read = j
				}
				break
			}
		}
	}
	from := 0
	if read >= 0 {
		// The prefix read is used content: its entry, and those of this
		// request's breakpoints inside it, are refreshed.
		from = sums[read]
		for i := 0; i <= read; i++ {
			if e := p.cache[prefix[i]]; e != nil && (i == read || b.blocks[i].bp) && now.Before(e.expires) {
				e.expires = now.Add(e.ttl)
			}
		}
	}
	b.CacheRead = from
	// Tokens written are billed at the TTL of the breakpoint they lead to.
	for i := read + 1; i <= last; i++ {
		bl := b.blocks[i]
		if !bl.bp || sums[i] < p.Profile.Cache.MinTokens {
			continue
		}
		p.cache[prefix[i]] = &entry{expires: now.Add(bl.ttl), written: now, ttl: bl.ttl}
		if bl.ttl >= time.Hour {
			b.CacheWrite1h += sums[i] - from
		} else {
			b.CacheWrite += sums[i] - from
		}
		from = sums[i]
	}
	b.Input = b.Prompt - from
}

// prefixCache bills a request under automatic prefix caching (OpenAI,
// Gemini implicit): prompts of at least MinTokens read the longest prefix
// seen within the TTL (idle, refreshed on use), in Increment steps; every
// prefix of the request is cached for the next, an entry past the
// provider's longest retention written anew. Prefixes are matched at
// message (content) boundaries.
func (p *Provider) prefixCache(b *Bill, api string) {
	now := p.Clock.Now()
	prefix := prefixHashes(b.blocks)
	sums := prefixSums(b.blocks)
	ttl := p.Profile.Cache.TTL
	if ttl <= 0 || api == "gemini" {
		// Gemini documents no retention for implicit hits ("send requests
		// with a similar prefix in a short amount of time"): OpenAI's
		// in-memory idle time is assumed.
		ttl = 5 * time.Minute
	}
	var longest time.Duration // OpenAI in_memory: at most an hour
	if api == "openai" || api == "responses" {
		longest = time.Hour
	}
	alive := func(e *entry) bool {
		return e != nil && now.Before(e.expires) && (longest == 0 || now.Sub(e.written) < longest)
	}
	hit := 0
	if b.Prompt >= p.Profile.Cache.MinTokens {
		for i := len(b.blocks) - 1; i >= 0; i-- {
			if alive(p.cache[prefix[i]]) {
				hit = sums[i]
				break
			}
		}
	}
	if step := p.Profile.Cache.Increment; step > 0 {
		hit = hit / step * step
	}
	if hit < p.Profile.Cache.MinTokens {
		hit = 0
	}
	b.CacheRead = hit
	b.Input = b.Prompt - hit
	for i := range b.blocks {
		if e := p.cache[prefix[i]]; alive(e) {
			e.expires = now.Add(ttl)
			continue
		}
		p.cache[prefix[i]] = &entry{expires: now.Add(ttl), written: now, ttl: ttl}
	}
}

func geminiStatus(code int) string {
	switch code {
	case 413:
		return "FAILED_PRECONDITION"
	case 429:
		return "RESOURCE_EXHAUSTED"
	}
	return "INVALID_ARGUMENT"
}

// prefixBreak compares the request with the previous main one: when they
// part before the previous one's end, the cached prefix broke there. The
// cause is an image when the block that changed carried more images
// before; Rewritten is what the request wrote again of what was cached.
func (p *Provider) prefixBreak(b *Bill) {
	if p.last == nil {
		return
	}
	d := 0
	for d < len(p.last) && d < len(b.blocks) && p.last[d].hash == b.blocks[d].hash {
		d++
	}
	if d >= len(p.last) {
		return
	}
	b.Break = true
	b.BreakCause = "other"
	if e := p.cache[p.lastAt]; e == nil || !p.Clock.Now().Before(e.expires) {
		// The previous prompt had left the cache: nothing cached was lost.
		b.BreakCause = "expired"
		return
	}
	if d < len(b.blocks) && b.blocks[d].images < p.last[d].images {
		b.BreakCause = "image"
	}
	sums := prefixSums(b.blocks)
	end := min(len(p.last), len(b.blocks)) - 1
	rewritten := sums[end] - b.CacheRead
	b.Rewritten = max(0, min(rewritten, b.CacheWrite+b.CacheWrite1h))
}

// cachedAt is the prefix hash a request's cache entry is under: its last
// breakpoint (Anthropic) or its whole prompt (OpenAI).
func (p *Provider) cachedAt(bs []block, anthropic bool) [32]byte {
	if len(bs) == 0 {
		return [32]byte{}
	}
	prefix := prefixHashes(bs)
	last := len(bs) - 1
	if anthropic {
		for last >= 0 && !bs[last].bp {
			last--
		}
		if last < 0 {
			return [32]byte{}
		}
	}
	return prefix[last]
}

func maxOf(bs []block, f func(block) int) int {
	m := 0
	for _, b := range bs {
		m = max(m, f(b))
	}
	return m
}

func prefixHashes(bs []block) [][32]byte {
	out := make([][32]byte, len(bs))
	var h [32]byte
	for i, b := range bs {
		h = sha256.Sum256(append(h[:], b.hash[:]...))
		out[i] = h
	}
	return out
}

func prefixSums(bs []block) []int {
	out := make([]int, len(bs))
	t := 0
	for i, b := range bs {
		t += b.tokens
		out[i] = t
	}
	return out
}

// messageFraming is the tokens each message costs beyond its content (role
// and separators), as the providers' chat templates add.
const messageFraming = 4

// memo returns the block read from raw bytes with hash h, reading it the
// first time only.
func (p *Provider) memo(h [32]byte, read func() (block, error)) (block, error) {
	return remember(&p.counts.mu, &p.counts.m, h, read)
}

// textBlock is a block of plain text under a role.
func (p *Provider) textBlock(role string, raw json.RawMessage, s func() string) block {
	h := hashOf(role, raw)
	b, _ := p.memo(h, func() (block, error) { return block{hash: h, tokens: p.text(s())}, nil })
	return b
}

// canonical returns a block's bytes without its cache_control member, keys
// sorted: moving a breakpoint does not change what is cached.
func canonical(raw json.RawMessage) ([]byte, map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, nil, err
	}
	delete(m, "cache_control")
	b, err := json.Marshal(m)
	return b, m, err
}

func hashOf(role string, b []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(role))
	h.Write([]byte{0})
	h.Write(b)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// imageSize reads a PNG's or JPEG's dimensions from the start of its
// base64 data.
func imageSize(b64 string) (int, int, error) {
	head := b64
	if len(head) > 4096 {
		head = head[:4096]
	}
	head = head[:len(head)/4*4]
	raw, err := base64.StdEncoding.DecodeString(head)
	if err != nil {
		return 0, 0, fmt.Errorf("image data is not base64: %v", err)
	}
	if len(raw) >= 24 && string(raw[1:4]) == "PNG" {
		return int(binary.BigEndian.Uint32(raw[16:20])), int(binary.BigEndian.Uint32(raw[20:24])), nil
	}
	if len(raw) > 4 && raw[0] == 0xFF && raw[1] == 0xD8 {
		for i := 2; i+9 < len(raw); {
			if raw[i] != 0xFF {
				break
			}
			m := raw[i+1]
			l := int(binary.BigEndian.Uint16(raw[i+2:]))
			if m >= 0xC0 && m <= 0xC3 {
				return int(binary.BigEndian.Uint16(raw[i+7:])), int(binary.BigEndian.Uint16(raw[i+5:])), nil
			}
			i += 2 + l
		}
	}
	return 0, 0, fmt.Errorf("could not process image")
}

// imageTokens prices one image and notes its size in the block.
//
// lead is what precedes the base64 in the string it was cut from (a data
// URL's "data:image/png;base64,"): an elided string's length is the whole
// string's.
func (p *Provider) imageTokens(b64, detail string, lead int, b *block, e elided) (int, error) {
	w, h, err := imageSize(b64)
	if err != nil {
		return 0, err
	}
	n := len(b64)
	if strings.IndexByte(b64, 0) >= 0 {
		n = e.length(b64) - lead
	}
	b.edge, b.size = max(b.edge, w, h), max(b.size, n)
	b.keys = append(b.keys, imageKey(b64, n))
	return tokens.ImageTokens(p.Profile, w, h, detail)
}

// unseen prices an image or document the request names but does not
// carry (a file id, a URL): the emulator has no such files, so a
// 1024×1024 image or one page, as the replay's notes say.
func (p *Provider) unseen(document bool, detail string) int {
	if document {
		if t, ok := tokens.PageTokens(p.Profile, ""); ok {
			return t
		}
		detail = ""
	}
	t, _ := tokens.ImageTokens(p.Profile, 1024, 1024, detail)
	return t
}

func (p *Provider) text(s string) int { return tokens.CounterFor(p.Profile.Tokenizer).Count(s) }

// anthropicMessage reads one message's content blocks; the first carries
// the message's framing.
func (p *Provider) anthropicMessage(e elided) ([]block, error) {
	raw := e.small
	var m struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	var out []block
	if len(m.Content) > 0 && m.Content[0] == '"' {
		out = append(out, p.textBlock(m.Role, m.Content, func() string { return unquote(m.Content) }))
	} else {
		var parts []json.RawMessage
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return nil, fmt.Errorf("messages: content: %v", err)
		}
		for _, raw := range parts {
			b, err := p.anthropicBlock(m.Role, raw, e)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
	}
	if len(out) > 0 {
		out[0].tokens += messageFraming
	}
	return out, nil
}

type anthropicPart struct {
	Type         string          `json:"type"`
	Text         string          `json:"text"`
	Name         string          `json:"name"`
	Input        json.RawMessage `json:"input"`
	Content      json.RawMessage `json:"content"`
	CacheControl *struct {
		TTL string `json:"ttl"`
	} `json:"cache_control"`
	Source *struct {
		Type      string `json:"type"`
		MediaType string `json:"media_type"`
		Data      string `json:"data"`
		FileID    string `json:"file_id"`
	} `json:"source"`
}

func (p *Provider) anthropicBlock(role string, raw json.RawMessage, e elided) (block, error) {
	return p.memo(hashOf(role, raw), func() (block, error) {
		var part anthropicPart
		if err := json.Unmarshal(raw, &part); err != nil {
			return block{}, err
		}
		b := block{}
		if part.CacheControl != nil {
			b.bp = true
			b.ttl = 5 * time.Minute
			if part.CacheControl.TTL == "1h" {
				b.ttl = time.Hour
			}
		}
		c, _, err := canonical(raw)
		if err != nil {
			return block{}, err
		}
		b.hash = hashOf(role, c)
		b.images = strings.Count(string(c), `"type":"image"`)
		b.tokens, err = p.anthropicTokens(part, &b, e)
		return b, err
	})
}

func (p *Provider) anthropicTokens(part anthropicPart, b *block, e elided) (int, error) {
	switch part.Type {
	case "text":
		return p.text(part.Text), nil
	case "image":
		if part.Source == nil {
			return 0, fmt.Errorf("image: source: field required")
		}
		if data, ok := p.files[part.Source.FileID]; ok && part.Source.Type == "file" {
			return p.imageTokens(data, "", 0, b, e)
		}
		if part.Source.Type != "base64" {
			return p.unseen(false, ""), nil // a file id or a URL
		}
		return p.imageTokens(part.Source.Data, "", 0, b, e)
	case "document":
		if part.Source == nil {
			return 0, fmt.Errorf("document: source: field required")
		}
		if part.Source.Type != "base64" || part.Source.MediaType != "application/pdf" {
			return p.unseen(true, ""), nil
		}
		return p.pdfTokens(e.resolve(part.Source.Data), b)
	case "tool_use":
		return p.text(part.Name) + p.text(string(part.Input)), nil
	case "tool_result":
		if len(part.Content) > 0 && part.Content[0] == '"' {
			var s string
			json.Unmarshal(part.Content, &s)
			return p.text(s), nil
		}
		var inner []anthropicPart
		if err := json.Unmarshal(part.Content, &inner); err != nil && len(part.Content) > 0 {
			return 0, err
		}
		t := 0
		for _, in := range inner {
			n, err := p.anthropicTokens(in, b, e)
			if err != nil {
				return 0, err
			}
			t += n
		}
		return t, nil
	}
	return p.text(part.Text), nil
}

func (p *Provider) openaiTokens(e elided, b *block) (int, error) {
	raw := e.small
	var m struct {
		Content   json.RawMessage `json:"content"`
		ToolCalls json.RawMessage `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return 0, err
	}
	t := p.text(string(m.ToolCalls))
	if len(m.Content) > 0 && m.Content[0] == '"' {
		var s string
		json.Unmarshal(m.Content, &s)
		return t + p.text(s), nil
	}
	var parts []struct {
		Type     string `json:"type"`
		Text     string `json:"text"`
		ImageURL *struct {
			URL    string `json:"url"`
			Detail string `json:"detail"`
		} `json:"image_url"`
		File *struct {
			Data string `json:"file_data"`
		} `json:"file"`
	}
	if len(m.Content) > 0 && string(m.Content) != "null" {
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return 0, err
		}
	}
	for _, part := range parts {
		switch part.Type {
		case "image_url":
			_, data, ok := strings.Cut(part.ImageURL.URL, ";base64,")
			if !ok {
				t += p.unseen(false, part.ImageURL.Detail)
				continue
			}
			n, err := p.imageTokens(data, part.ImageURL.Detail, len(part.ImageURL.URL)-len(data), b, e)
			if err != nil {
				return 0, err
			}
			t += n
		case "file":
			if part.File == nil {
				return 0, fmt.Errorf("file: no file object")
			}
			_, data, ok := strings.Cut(e.resolve(part.File.Data), "application/pdf;base64,")
			if !ok {
				t += p.unseen(true, "") // a file id
				continue
			}
			n, err := p.pdfTokens(data, b)
			if err != nil {
				return 0, err
			}
			t += n
		default:
			t += p.text(part.Text)
		}
	}
	return t, nil
}

func unquote(raw json.RawMessage) string {
	var s string
	json.Unmarshal(raw, &s)
	return s
}

// responsesItem reads one Responses input item as one block: a message
// (content a string or input_text, input_image and input_file parts), a
// function call, a function call's output (a string or such parts); any
// other item (reasoning, a compaction) is billed as its text.
func (p *Provider) responsesItem(e elided) (block, error) {
	raw := e.small
	var it struct {
		Type      string          `json:"type"`
		Content   json.RawMessage `json:"content"`
		Name      string          `json:"name"`
		Arguments string          `json:"arguments"`
		Output    json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &it); err != nil {
		return block{}, err
	}
	b := block{hash: hashOf("responses", raw), tokens: messageFraming}
	parts := func(c json.RawMessage) error {
		if len(c) == 0 || string(c) == "null" {
			return nil
		}
		if c[0] == '"' {
			b.tokens += p.text(unquote(c))
			return nil
		}
		var ps []struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			ImageURL string `json:"image_url"`
			Detail   string `json:"detail"`
			FileData string `json:"file_data"`
			FileID   string `json:"file_id"`
		}
		if err := json.Unmarshal(c, &ps); err != nil {
			return err
		}
		for _, part := range ps {
			switch part.Type {
			case "input_image":
				_, data, ok := strings.Cut(part.ImageURL, ";base64,")
				lead := len(part.ImageURL) - len(data) // "data:…;base64,"
				if stored, has := p.files[part.FileID]; has && part.ImageURL == "" {
					data, lead, ok = stored, 0, true
				}
				if !ok {
					b.images++
					b.tokens += p.unseen(false, part.Detail)
					continue
				}
				n, err := p.imageTokens(data, part.Detail, lead, &b, e)
				if err != nil {
					return err
				}
				b.images++
				b.tokens += n
			case "input_file":
				_, data, ok := strings.Cut(e.resolve(part.FileData), "application/pdf;base64,")
				if !ok {
					b.tokens += p.unseen(true, "")
					continue
				}
				n, err := p.pdfTokens(data, &b)
				if err != nil {
					return err
				}
				b.tokens += n
			default:
				b.tokens += p.text(part.Text)
			}
		}
		return nil
	}
	switch it.Type {
	case "", "message":
		return b, parts(it.Content)
	case "function_call":
		b.tokens += p.text(it.Name) + p.text(it.Arguments)
		return b, nil
	case "function_call_output":
		return b, parts(it.Output)
	}
	b.tokens += p.text(string(raw))
	return b, nil
}

// filesAPI answers the Files API calls (Anthropic's and OpenAI's
// multipart upload, Gemini's resumable one), reporting whether r was one.
// Uploads are counted in bytes as sent, never billed as a request.
func (p *Provider) filesAPI(w http.ResponseWriter, r *http.Request) bool {
	path := r.URL.Path
	if !strings.HasPrefix(path, "/upload/") && !strings.HasPrefix(path, "/v1/files") && !strings.HasPrefix(path, "/v1beta/files/") {
		return false
	}
	body, _ := io.ReadAll(r.Body) // not the rotating buffers: they hold the previous request (p.prev)
	switch {
	case r.Method == http.MethodPost && path == "/v1/files":
		_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil {
			http.Error(w, "not multipart", 400)
			return true
		}
		form, err := multipart.NewReader(bytes.NewReader(body), params["boundary"]).ReadForm(64 << 20)
		if err != nil || len(form.File["file"]) != 1 {
			http.Error(w, "no file", 400)
			return true
		}
		f, _ := form.File["file"][0].Open()
		data, _ := io.ReadAll(f)
		id := p.keepFile(data, len(body))
		w.Header().Set("Content-Type", "application/json")
		if r.Header.Get("Anthropic-Beta") != "" {
			fmt.Fprintf(w, `{"id":"file_%s","type":"file","size_bytes":%d}`, id, len(data))
			p.files["file_"+id] = p.files[id]
			return true
		}
		fmt.Fprintf(w, `{"id":"file-%s","object":"file","bytes":%d,"expires_at":%d}`, id, len(data), p.Clock.Now().Add(7*24*time.Hour).Unix())
		p.files["file-"+id] = p.files[id]
		return true
	case r.Method == http.MethodPost && path == "/upload/v1beta/files":
		if p.sessions == nil {
			p.sessions = map[string]string{}
		}
		u := fmt.Sprintf("http://provider.sim/upload/session/%d", len(p.sessions))
		p.sessions[u] = r.Header.Get("X-Goog-Upload-Header-Content-Type")
		p.uploaded += int64(len(body))
		w.Header().Set("X-Goog-Upload-Url", u)
		return true
	case r.Method == http.MethodPost && strings.HasPrefix(path, "/upload/session/"):
		mt, ok := p.sessions["http://provider.sim"+path]
		if !ok {
			http.Error(w, "no such upload", 404)
			return true
		}
		id := p.keepFile(body, len(body))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"file":{"name":"files/%s","mimeType":%q,"uri":"http://provider.sim/v1beta/files/%s","state":"ACTIVE","expirationTime":%q}}`,
			id, mt, id, p.Clock.Now().Add(48*time.Hour).Format(time.RFC3339))
		return true
	case r.Method == http.MethodDelete && (strings.HasPrefix(path, "/v1/files/") || strings.HasPrefix(path, "/v1beta/files/")):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{}`) // kept: an id names its content, and memoised messages may name it
		return true
	}
	return false
}

// keepFile holds data as a file named by its content and counts the
// upload's bytes.
func (p *Provider) keepFile(data []byte, sent int) string {
	if p.files == nil {
		p.files = map[string]string{}
	}
	sum := sha256.Sum256(data)
	id := fmt.Sprintf("%x", sum[:12])
	p.files[id] = base64.StdEncoding.EncodeToString(data)
	p.uploaded += int64(sent)
	return id
}

// Uploaded is the bytes the Files API received.
func (p *Provider) Uploaded() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.uploaded
}
