package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/tokens"
)

// Text at four characters a token makes every count in these tests exact.
var (
	claudeLike = tokens.Profile{Name: "claude-like", Family: "anthropic", ContextWindow: 200_000, Vision: true, Tokenizer: "chars4",
		Image: tokens.ImageRule{Rule: "anthropic_patch", MaxEdge: 1568, MaxTokens: 1568}, Limits: tokens.Limits{MaxImages: 100},
		Cache: tokens.CacheRules{MinTokens: 1024, Breakpoints: 4, TTL: 5 * time.Minute}}
	gptLike = tokens.Profile{Name: "gpt-like", Family: "openai", ContextWindow: 128_000, Vision: true, Tokenizer: "chars4",
		Image: tokens.ImageRule{Rule: "openai_tile", BaseTokens: 85, TileTokens: 170},
		Cache: tokens.CacheRules{MinTokens: 1024, Increment: 128, TTL: 5 * time.Minute, Automatic: true}}
)

func text(tokens int) string { return strings.Repeat("abcd", tokens) }

type usage struct {
	Input      int `json:"input_tokens"`
	CacheWrite int `json:"cache_creation_input_tokens"`
	CacheRead  int `json:"cache_read_input_tokens"`
	Output     int `json:"output_tokens"`
	Creation   struct{ Ephemeral5m, Ephemeral1h int }
	Prompt     int `json:"prompt_tokens"`
	Details    struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	CacheDetail struct {
		M5 int `json:"ephemeral_5m_input_tokens"`
		H1 int `json:"ephemeral_1h_input_tokens"`
	} `json:"cache_creation"`
}

func call(t *testing.T, p *Provider, path, body string) (int, usage, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://provider"+path, strings.NewReader(body))
	resp, err := p.Transport().RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	var out struct{ Usage usage }
	json.Unmarshal(b, &out)
	return resp.StatusCode, out.Usage, string(b)
}

// anthropicBody is a request with a system block of sys tokens (a
// breakpoint on it when bp) and one user message of user tokens (message
// framing included) with a breakpoint on its block when last.
func anthropicBody(sys int, bp string, user int, last string) string {
	cc := func(ttl string) string {
		switch ttl {
		case "":
			return ""
		case "5m":
			return `,"cache_control":{"type":"ephemeral"}`
		}
		return `,"cache_control":{"type":"ephemeral","ttl":"` + ttl + `"}`
	}
	return `{"model":"m","max_tokens":100,"system":[{"type":"text","text":"` + text(sys) + `"` + cc(bp) + `}],` +
		`"messages":[{"role":"user","content":[{"type":"text","text":"` + text(user-messageFraming) + `"` + cc(last) + `}]}]}`
}

// The documented example: 100,000 tokens read from the cache and 50 after
// the breakpoint answer input_tokens 50; the first request wrote them.
func TestAnthropicUsageAfterTheLastBreakpoint(t *testing.T) {
	p := NewProvider(claudeLike, NewClock(), nil)
	body := anthropicBody(100_000, "5m", 50, "")
	_, u, raw := call(t, p, "/v1/messages", body)
	if u.Input != 50 || u.CacheWrite != 100_000 || u.CacheRead != 0 || u.CacheDetail.M5 != 100_000 {
		t.Fatalf("first request: %s; want 100,000 written, 50 input", raw)
	}
	_, u, raw = call(t, p, "/v1/messages", body)
	if u.Input != 50 || u.CacheWrite != 0 || u.CacheRead != 100_000 {
		t.Fatalf("second request: %s; want 100,000 read, 0 written, input_tokens 50", raw)
	}
	if total := u.Input + u.CacheWrite + u.CacheRead; total != 100_050 {
		t.Fatalf("total input %d; want 100,050", total)
	}
}

// The 5-minute TTL is refreshed by each hit; an hour's TTL is billed as
// such; a prompt under the model's minimum is not cached at all.
func TestAnthropicTTLRefreshAndMinimum(t *testing.T) {
	clock := NewClock()
	p := NewProvider(claudeLike, clock, nil)
	body := anthropicBody(5_000, "5m", 20, "")
	call(t, p, "/v1/messages", body)
	for i, gap := range []time.Duration{4 * time.Minute, 4 * time.Minute, 4 * time.Minute} {
		clock.Advance(gap)
		if _, u, raw := call(t, p, "/v1/messages", body); u.CacheRead != 5_000 {
			t.Fatalf("hit %d after %v, 4 minutes after the last use: %s; want a read", i, gap, raw)
		}
	}
	clock.Advance(6 * time.Minute)
	if _, u, raw := call(t, p, "/v1/messages", body); u.CacheRead != 0 || u.CacheWrite != 5_000 {
		t.Fatalf("6 minutes idle: %s; want the prefix written again", raw)
	}

	hour := anthropicBody(5_000, "1h", 20, "")
	p = NewProvider(claudeLike, clock, nil)
	if _, u, raw := call(t, p, "/v1/messages", hour); u.CacheDetail.H1 != 5_000 || u.CacheDetail.M5 != 0 {
		t.Fatalf("1-hour breakpoint: %s; want 5,000 written at the hour's TTL", raw)
	}
	clock.Advance(40 * time.Minute)
	if _, u, raw := call(t, p, "/v1/messages", hour); u.CacheRead != 5_000 {
		t.Fatalf("40 minutes later: %s; want a read", raw)
	}
	bills := p.Bills()
	if b := bills[0]; b.CacheWrite1h != 5_000 || b.CacheWrite != 0 {
		t.Fatalf("billed %+v; want the write at the hour's price", b)
	}

	p = NewProvider(claudeLike, clock, nil)
	small := anthropicBody(900, "5m", 20, "")
	call(t, p, "/v1/messages", small)
	if _, u, raw := call(t, p, "/v1/messages", small); u.CacheRead != 0 || u.CacheWrite != 0 || u.Input != 920 {
		t.Fatalf("900 tokens, under the 1,024 minimum: %s; want nothing cached, all input", raw)
	}
}

// Reads walk back at most 20 blocks from a breakpoint; a fifth breakpoint
// is refused as the API refuses it; a prompt past the window is "prompt is
// too long".
func TestAnthropicLookbackBreakpointsAndWindow(t *testing.T) {
	p := NewProvider(claudeLike, NewClock(), nil)
	blocks := func(n int, bpAt ...int) string {
		var parts []string
		for i := range n {
			cc := ""
			for _, b := range bpAt {
				if b == i {
					cc = `,"cache_control":{"type":"ephemeral"}`
				}
			}
			parts = append(parts, fmt.Sprintf(`{"type":"text","text":"%s %03d"%s}`, text(100), i, cc))
		}
		return `{"model":"m","max_tokens":100,"messages":[{"role":"user","content":[` + strings.Join(parts, ",") + `]}]}`
	}
	call(t, p, "/v1/messages", blocks(12, 11))
	if _, u, raw := call(t, p, "/v1/messages", blocks(35, 34)); u.CacheRead != 0 {
		t.Fatalf("a breakpoint 23 blocks past the last write read %d: %s", u.CacheRead, raw)
	}
	p = NewProvider(claudeLike, NewClock(), nil)
	call(t, p, "/v1/messages", blocks(12, 11))
	_, u, _ := call(t, p, "/v1/messages", blocks(25, 24))
	if u.CacheRead == 0 {
		t.Fatal("a write 13 blocks before the breakpoint was not read")
	}
	status, _, raw := call(t, p, "/v1/messages", blocks(6, 0, 1, 2, 3, 4))
	if status != 400 || !strings.Contains(raw, "A maximum of 4 blocks with cache_control may be provided. Found 5.") {
		t.Fatalf("five breakpoints: %d %s", status, raw)
	}
	status, _, raw = call(t, p, "/v1/messages", anthropicBody(200_001, "5m", 20, ""))
	if status != 400 || !strings.Contains(raw, `"type":"invalid_request_error"`) || !strings.Contains(raw, "prompt is too long: 200021 tokens > 200000 maximum") {
		t.Fatalf("over the window: %d %s", status, raw)
	}
}

// OpenAI: no cache under 1,024 tokens; above, the shared prefix is read in
// 128-token steps (1,024, 1,152, …), within the TTL, refreshed on use.
func TestOpenAICachedTokensIn128Steps(t *testing.T) {
	clock := NewClock()
	p := NewProvider(gptLike, clock, nil)
	body := func(prefix, rest int) string {
		return `{"model":"m","messages":[{"role":"system","content":"` + text(prefix-messageFraming) + `"},{"role":"user","content":"` + text(rest-messageFraming) + `"}]}`
	}
	call(t, p, "/v1/chat/completions", body(1000, 10))
	if _, u, raw := call(t, p, "/v1/chat/completions", body(1000, 20)); u.Details.CachedTokens != 0 || u.Prompt != 1020 {
		t.Fatalf("1,020-token prompt: %s; want none cached", raw)
	}
	for _, c := range []struct{ prefix, want int }{{1030, 1024}, {1151, 1024}, {1152, 1152}, {1300, 1280}, {5000, 4992}} {
		p := NewProvider(gptLike, clock, nil)
		call(t, p, "/v1/chat/completions", body(c.prefix, 10))
		_, u, raw := call(t, p, "/v1/chat/completions", body(c.prefix, 30))
		if u.Details.CachedTokens != c.want || u.Prompt != c.prefix+30 {
			t.Fatalf("shared prefix of %d tokens: %s; want %d cached of %d", c.prefix, raw, c.want, c.prefix+30)
		}
	}
	p = NewProvider(gptLike, clock, nil)
	call(t, p, "/v1/chat/completions", body(2000, 10))
	clock.Advance(4 * time.Minute)
	if _, u, _ := call(t, p, "/v1/chat/completions", body(2000, 11)); u.Details.CachedTokens != 1920 {
		t.Fatalf("4 minutes later: %d cached; want 1,920", u.Details.CachedTokens)
	}
	clock.Advance(4 * time.Minute)
	if _, u, _ := call(t, p, "/v1/chat/completions", body(2000, 12)); u.Details.CachedTokens != 1920 {
		t.Fatalf("4 minutes after the last use: %d cached; want the refreshed prefix", u.Details.CachedTokens)
	}
	clock.Advance(6 * time.Minute)
	if _, u, _ := call(t, p, "/v1/chat/completions", body(2000, 13)); u.Details.CachedTokens != 0 {
		t.Fatalf("6 minutes idle: %d cached; want none", u.Details.CachedTokens)
	}
	status, _, raw := call(t, p, "/v1/chat/completions", body(128_001, 10))
	if status != 400 || !strings.Contains(raw, `"code":"context_length_exceeded"`) {
		t.Fatalf("over the window: %d %s", status, raw)
	}
}

// Images: tokens by the profile's rule from the image's header; more than
// the limit's count is refused with the documented message.
func TestImagesAreCountedAndLimited(t *testing.T) {
	g := &gen{rng: newRand(1), p: Params{Width: 1280, Height: 800}}
	img := g.image("tool")
	p := NewProvider(claudeLike, NewClock(), nil)
	one := `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + img.B64 + `"}}`
	body := func(n int) string {
		return `{"model":"m","max_tokens":10,"messages":[{"role":"user","content":[` + strings.TrimSuffix(strings.Repeat(one+",", n), ",") + `]}]}`
	}
	_, u, raw := call(t, p, "/v1/messages", body(2))
	want, _ := tokens.ImageTokens(claudeLike, 1280, 800, "")
	if u.Input != 2*want+messageFraming {
		t.Fatalf("two 1280×800 screenshots: %s; want %d input tokens", raw, 2*want+messageFraming)
	}
	status, _, raw := call(t, p, "/v1/messages", body(101))
	if status != 400 || !strings.Contains(raw, "Too much media: 0 document pages + 101 images > 100") {
		t.Fatalf("101 images: %d %s", status, raw)
	}
	if b := p.Bills(); b[len(b)-1].Failed != "images" {
		t.Fatalf("the refusal was not billed as failed: %+v", b[len(b)-1])
	}
	if !bytes.Contains([]byte(raw), []byte(`"request_id"`)) {
		t.Fatalf("not the documented error shape: %s", raw)
	}

	// The many-image rule: past 20 images, none may pass 2000 pixels.
	g.p.Width, g.p.Height = 2400, 1000
	wide := g.image("user")
	many := claudeLike
	many.Limits = tokens.Limits{MaxImages: 100, ManyImagesAbove: 20, ManyImagesMaxEdge: 2000, MaxImageBytes: 5 << 20}
	p = NewProvider(many, NewClock(), nil)
	one = `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + wide.B64 + `"}}`
	if status, _, raw := call(t, p, "/v1/messages", body(20)); status != 200 {
		t.Fatalf("20 images of 2400 px: %d %s; the rule starts past 20", status, raw)
	}
	status, _, raw = call(t, p, "/v1/messages", body(21))
	if status != 400 || !strings.Contains(raw, "exceed max allowed size for many-image requests: 2000 pixels") {
		t.Fatalf("21 images of 2400 px: %d %s", status, raw)
	}
	// And no image past 5 MB.
	g.p.Width, g.p.Height, g.p.ImageKB = 2400, 2400, 5200
	big := g.image("user")
	one = `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + big.B64 + `"}}`
	status, _, raw = call(t, p, "/v1/messages", body(1))
	if status != 400 || !strings.Contains(raw, "image exceeds 5 MB maximum") {
		t.Fatalf("a %d-byte image: %d %.300s", len(big.B64), status, raw)
	}
}

// The minimum cacheable length holds at every breakpoint: a 500-token
// system breakpoint is not written even when the last one is.
func TestAnthropicMinimumPerBreakpoint(t *testing.T) {
	p := NewProvider(claudeLike, NewClock(), nil)
	_, u, raw := call(t, p, "/v1/messages", anthropicBody(500, "5m", 2000, "5m"))
	if u.CacheWrite != 2500 || u.Input != 0 {
		t.Fatalf("first request: %s; want 2,500 written at the last breakpoint", raw)
	}
	// A new user message: the old system prefix alone was never cached.
	_, u, raw = call(t, p, "/v1/messages", anthropicBody(500, "5m", 1900, "5m"))
	if u.CacheRead != 0 {
		t.Fatalf("a 500-token system breakpoint was cached: %s", raw)
	}
}

// OpenAI keeps an in-memory prefix an hour at most; after that it is
// written again and read as usual, not lost for good.
func TestOpenAIRetentionRenews(t *testing.T) {
	clock := NewClock()
	p := NewProvider(gptLike, clock, nil)
	body := func(rest int) string {
		return `{"model":"m","messages":[{"role":"system","content":"` + text(2000-messageFraming) + `"},{"role":"user","content":"` + text(rest) + `"}]}`
	}
	for minute := 0; minute <= 90; minute += 3 {
		_, u, _ := call(t, p, "/v1/chat/completions", body(10+minute))
		switch {
		case (minute == 0 || minute == 60) && u.Details.CachedTokens != 0:
			t.Fatalf("minute %d: %d cached; the entry is new, or an hour old", minute, u.Details.CachedTokens)
		case minute != 0 && minute != 60 && u.Details.CachedTokens < 1920:
			t.Fatalf("minute %d: %d cached; want the prefix", minute, u.Details.CachedTokens)
		}
		clock.Advance(3 * time.Minute)
	}
}

// Gemini generateContent: usage in usageMetadata (promptTokenCount
// includes the cached tokens), implicit prefix caching from the model's
// minimum, inlineData images at the tile rule, the documented overflow
// error.
func TestGeminiImplicitCachingAndUsage(t *testing.T) {
	prof, ok := tokens.Default().Lookup("gemini-2.5-flash")
	if !ok {
		t.Fatal("no gemini-2.5-flash profile")
	}
	prof.Tokenizer = "chars4"
	p := NewProvider(prof, NewClock(), nil)
	png := fmt.Sprintf(`{"inlineData":{"mimeType":"image/png","data":%q}}`, pngBase64(t, 1280, 800))
	body := func(rest int) string {
		return `{"systemInstruction":{"parts":[{"text":"` + text(3000) + `"}]},"contents":[{"role":"user","parts":[` + png + `,{"text":"` + text(rest) + `"}]}]}`
	}
	get := func(b string) (int, string) {
		req, _ := http.NewRequest("POST", "http://provider/v1beta/models/gemini-2.5-flash:generateContent", strings.NewReader(b))
		resp, _ := p.Transport().RoundTrip(req)
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out)
	}
	// 1280×800: 2×2 tiles of 258.
	if _, raw := get(body(10)); !strings.Contains(raw, `"promptTokenCount":`+fmt.Sprint(3000+4+4*258+10+4)) || !strings.Contains(raw, `"cachedContentTokenCount":0`) {
		t.Fatalf("first request: %s", raw)
	}
	if _, raw := get(body(20)); !strings.Contains(raw, `"cachedContentTokenCount":3004`) {
		t.Fatalf("same system instruction: %s; want its 3,004 tokens cached", raw)
	}
	status, raw := get(`{"contents":[{"role":"user","parts":[{"text":"` + text(1_048_577) + `"}]}]}`)
	if status != 400 || !strings.Contains(raw, "The input token count (") || !strings.Contains(raw, `"status":"INVALID_ARGUMENT"`) {
		t.Fatalf("over the window: %d %.300s", status, raw)
	}
}

func pngBase64(t *testing.T, w, h int) string {
	t.Helper()
	g := &gen{rng: newRand(1), p: Params{Width: w, Height: h}}
	return g.image("tool").B64
}
