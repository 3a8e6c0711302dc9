package tokens

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"pgregory.net/rapid"
)

func TestLookupPicksTheMostSpecificPattern(t *testing.T) {
	cases := map[string]string{
		"gpt-4o":                     "gpt-4o",
		"gpt-4o-2024-08-06":          "gpt-4o",
		"gpt-4o-mini":                "gpt-4o-mini",
		"GPT-4o-Mini-2024-07-18":     "gpt-4o-mini",
		"openai/gpt-5-mini":          "gpt-5-mini",
		"gpt-5":                      "gpt-5",
		"gpt-5.4-mini":               "gpt-5.4",
		"claude-sonnet-4-6":          "claude-standard",
		"claude-opus-4-7":            "claude-high-resolution",
		"anthropic/claude-opus-4-8":  "claude-high-resolution",
		"claude-3-5-sonnet-20241022": "claude-3",
		"claude-unknown-9":           "claude-standard",
		"models/gemini-2.5-pro":      "gemini-2",
		"gemini-3-pro-preview":       "gemini-3",
		"qwen2.5-vl-72b-instruct":    "qwen2-vl",
		"qwen3-vl-235b-a22b":         "qwen3-vl",
		"qwen-vl-max-latest":         "qwen-vl-dashscope",
		"qwen3-coder-plus":           "qwen3-coder",
	}
	for model, want := range cases {
		p, ok := Default().Lookup(model)
		if !ok || p.Name != want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", model, p.Name, ok, want)
		}
	}
}

func TestUnknownModelGetsTheDefaultAndAWarning(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	p := Default().Resolve("my-local-llava", log)
	if p.Name != "default" || p.ContextWindow != 32768 {
		t.Fatalf("got %s/%d; want the conservative default", p.Name, p.ContextWindow)
	}
	if !strings.Contains(logs.String(), "unknown model") || !strings.Contains(logs.String(), "my-local-llava") {
		t.Fatalf("no warning logged: %q", logs.String())
	}
	if _, err := ImageTokens(p, 1920, 1080, ""); err != nil {
		t.Fatalf("default profile cannot price an image: %v", err)
	}
}

func TestOverridesReplaceByNameOrAdd(t *testing.T) {
	local := Profile{Name: "llava", Match: []string{"llava*"}, Family: "ollama", ContextWindow: 4096, Vision: true,
		Tokenizer: "chars4", Image: ImageRule{Rule: "fixed", Tokens: 576}}
	smaller := mustProfile(t, "gpt-4o")
	smaller.ContextWindow = 8000
	tbl, err := Default().With(local, smaller)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := tbl.Lookup("llava:13b"); !ok || p.Name != "llava" {
		t.Fatalf("added profile not found: %v", p.Name)
	}
	if p, _ := tbl.Lookup("gpt-4o"); p.ContextWindow != 8000 {
		t.Fatalf("override did not replace: %d", p.ContextWindow)
	}
	if p, _ := Default().Lookup("gpt-4o"); p.ContextWindow != 128000 {
		t.Fatal("With modified the shared default table")
	}
	bad := local
	bad.Image = ImageRule{Rule: "openai_tile"}
	if _, err := Default().With(bad); err == nil || !strings.Contains(err.Error(), "base_tokens") {
		t.Fatalf("invalid override accepted: %v", err)
	}
}

func TestParseRefusesBadTables(t *testing.T) {
	for name, y := range map[string]string{
		"version":   "version: 2\nprofiles: []",
		"rule":      "version: 1\ndefault: {name: d, context_window: 1, tokenizer: o200k, vision: true, image: {rule: magic}}",
		"tokenizer": "version: 1\ndefault: {name: d, context_window: 1, tokenizer: gpt2, image: {rule: none}}",
		"yaml":      "version: [",
	} {
		if _, err := Parse([]byte(y)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	tbl := Default()
	if tbl.Default.Cache.TTL != 0 {
		t.Fatalf("default profile ttl %v", tbl.Default.Cache.TTL)
	}
	if p, _ := tbl.Lookup("claude-sonnet-4-6"); p.Cache.TTL != 5*time.Minute || p.Limits.ManyImagesAbove != 20 {
		t.Fatalf("cache and limits not parsed: %+v %+v", p.Cache, p.Limits)
	}
}

// A profile a config file gives is checked for what its rule needs, and
// the refusal names the profile and the field.
func TestValidateNamesWhatAProfileLacks(t *testing.T) {
	ok := Profile{Name: "p", ContextWindow: 1000, Tokenizer: "o200k", Vision: true}
	for want, edit := range map[string]func(*Profile){
		"profile without a name":                               func(p *Profile) { p.Name = "" },
		`profile "p": context_window must be positive`:         func(p *Profile) { p.ContextWindow = 0 },
		`profile "p": tokenizer "gpt2": want o200k, cl100k or`: func(p *Profile) { p.Tokenizer = "gpt2" },
		"openai_patch needs multiplier and levels":             func(p *Profile) { p.Image = ImageRule{Rule: "openai_patch"} },
		`openai_patch auto level "auto" is not among its levels`: func(p *Profile) {
			p.Image = ImageRule{Rule: "openai_patch", Multiplier: 1, Levels: map[string]PatchLevel{"high": {}}, Auto: "auto"}
		},
		"anthropic_area needs max_edge and max_tokens":             func(p *Profile) { p.Image = ImageRule{Rule: "anthropic_area", MaxEdge: 1568} },
		"fixed needs tokens":                                       func(p *Profile) { p.Image = ImageRule{Rule: "fixed"} },
		"gemini_tile needs tokens, tile and small_edge":            func(p *Profile) { p.Image = ImageRule{Rule: "gemini_tile", Tokens: 258} },
		"gemini_media_resolution needs resolutions with a default": func(p *Profile) { p.Image = ImageRule{Rule: "gemini_media_resolution"} },
		"qwen_smart_resize needs factor, min_pixels and max_pixels ≥ min_pixels": func(p *Profile) {
			p.Image = ImageRule{Rule: "qwen_smart_resize", Factor: 28, MinPixels: 100, MaxPixels: 10}
		},
		`profile "p": a vision model needs an image rule`: func(p *Profile) { p.Image = ImageRule{Rule: "none"} },
	} {
		p := ok
		p.Image = ImageRule{Rule: "fixed", Tokens: 85}
		if err := p.Validate(); err != nil {
			t.Fatalf("the valid profile: %v", err)
		}
		edit(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v; want %q", err, want)
		}
	}
}

func TestRuleEdges(t *testing.T) {
	gpt54 := mustProfile(t, "gpt-5.4")
	if _, err := ImageTokens(gpt54, 100, 100, "ultra"); !errors.Is(err, ErrUnknownDetail) {
		t.Fatalf("unknown detail: %v", err)
	}
	// gpt-5.6 "original" has no budget: a huge image is rejected, not resized.
	if _, err := ImageTokens(mustProfile(t, "gpt-5.6"), 8000, 8000, "original"); !errors.Is(err, ErrRejected) {
		t.Fatalf("over 30000 patches: %v", err)
	}
	if _, err := ImageTokens(mustProfile(t, "qwen2-vl"), 10000, 20, ""); !errors.Is(err, ErrRejected) {
		t.Fatalf("aspect over 200: %v", err)
	}
	if _, err := ImageTokens(mustProfile(t, "qwen3-coder"), 10, 10, ""); !errors.Is(err, ErrNoVision) {
		t.Fatalf("text-only model priced an image: %v", err)
	}
	if _, err := ImageTokens(gpt54, 0, 10, ""); !errors.Is(err, ErrBadDimensions) {
		t.Fatalf("zero width: %v", err)
	}
	// The low detail of the tile rule costs the base, whatever the size.
	if n, _ := ImageTokens(mustProfile(t, "gpt-4o"), 4000, 3000, "low"); n != 85 {
		t.Fatalf("gpt-4o low = %d; want 85", n)
	}
	// The OpenAI 2048 step rounds to nearest, ties to even (community billing
	// data on gpt-4.1: 2049×513 → 8 tiles, 2050×513 → 4 tiles).
	gpt41, _ := Default().Lookup("gpt-4.1")
	if e, _ := EstimateImage(gpt41, 2049, 513, "high"); e.Units != 8 {
		t.Fatalf("2049×513: %d tiles; want 8", e.Units)
	}
	if e, _ := EstimateImage(gpt41, 2050, 513, "high"); e.Units != 4 {
		t.Fatalf("2050×513: %d tiles; want 4", e.Units)
	}
}

// Property: rules are symmetric where providers are (transposing an image
// transposes its resize and keeps its cost), monotone enough never to price
// a larger image below a smaller one of the same shape, and within caps.
func TestRuleProperties(t *testing.T) {
	for _, name := range []string{"claude-standard", "claude-high-resolution", "gpt-4o", "gpt-5.4", "qwen2-vl", "qwen3-vl", "gemini-2"} {
		p := mustProfile(t, name)
		t.Run(name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				w := rapid.IntRange(1, 9000).Draw(rt, "w")
				h := rapid.IntRange(max(1, w/150), min(9000, w*150)).Draw(rt, "h")
				a, err1 := EstimateImage(p, w, h, "")
				b, err2 := EstimateImage(p, h, w, "")
				if (err1 == nil) != (err2 == nil) {
					rt.Fatalf("transpose changed acceptance: %v / %v", err1, err2)
				}
				if err1 != nil {
					return
				}
				if p.Family != "openai" && (a.Tokens != b.Tokens || a.Width != b.Height) {
					rt.Fatalf("%d×%d → %+v but %d×%d → %+v", w, h, a, h, w, b)
				}
				if p.Image.Rule == "anthropic_patch" && (a.Tokens > p.Image.MaxTokens || max(a.Width, a.Height) > p.Image.MaxEdge) {
					rt.Fatalf("%d×%d → %+v over the tier caps", w, h, a)
				}
				if a.Tokens <= 0 {
					rt.Fatalf("%d×%d priced at %d", w, h, a.Tokens)
				}
			})
		})
	}
}

// Measured here: random base64 costs about 1.4 to 1.5 characters per BPE
// token, so counting it at Base64CharsPerToken stays within 10% of the
// truth while never feeding it to the tokenizer.
func TestBase64Ratio(t *testing.T) {
	raw := make([]byte, 30000)
	rand.Read(raw)
	s := base64.StdEncoding.EncodeToString(raw)
	for _, name := range []string{"o200k", "cl100k"} {
		b := CounterFor(name).(*BPE)
		b.once.Do(func() { b.c, b.err = tokenizerGet(b) })
		real, _ := b.c.Count(s)
		ratio := float64(len(s)) / float64(real)
		if ratio < Base64CharsPerToken*0.9 || ratio > Base64CharsPerToken*1.1 {
			t.Errorf("%s: %.2f chars per token on base64; constant is %.2f", name, ratio, Base64CharsPerToken)
		}
		est := b.Count("look: " + s + " done")
		if est < real*9/10 || est > real*11/10 {
			t.Errorf("%s: estimate %d vs real %d", name, est, real)
		}
	}
}

func TestCountText(t *testing.T) {
	o := CounterFor("o200k")
	if n := o.Count("hello world"); n != 2 {
		t.Fatalf("o200k(hello world) = %d; want 2", n)
	}
	if n := CounterFor("cl100k").Count("hello world"); n != 2 {
		t.Fatalf("cl100k(hello world) = %d; want 2", n)
	}
	if n := CounterFor("chars4").Count("héllo wörld!"); n != 3 {
		t.Fatalf("chars4 = %d; want 3 (12 runes)", n)
	}
	if CounterFor("nope").Count("abcd") != 1 {
		t.Fatal("unknown tokenizer name must fall back to chars4")
	}
	// A 1 MB data URL pasted into text: counted, fast, never tokenized.
	big := "see data:image/png;base64," + strings.Repeat("iVBORw0KGgo", 100000) + " end"
	n := o.Count(big)
	if n < 1_100_000*10/16 || n > 1_100_000*10/13 {
		t.Fatalf("1.1M base64 chars counted as %d tokens", n)
	}
	if s, e := nextBase64Run("short abc"); s != 9 || e != 9 {
		t.Fatalf("no run: %d,%d", s, e)
	}
}

func TestCharsAccounting(t *testing.T) {
	ref := blob.Of([]byte("x"))
	img := chat.Image{Ref: ref, MediaType: "image/png"}
	marker := chat.Marker{Of: "image", MediaType: "image/png", Caption: "a — b", Reason: "budget"}
	recallable := marker
	recallable.Handle = "iabcdefghijk"
	cases := []struct {
		name string
		msg  chat.Message
		est  int
		want int
	}{
		{"text counts runes", chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "héllo"}}}, 0, 5},
		{"image is estimate×4", chat.Message{Role: chat.User, Parts: []chat.Part{img}}, 0, 6400},
		{"custom estimate", chat.Message{Role: chat.User, Parts: []chat.Part{img, chat.Document{Ref: ref}}}, 100, 800},
		{"tool call fields", chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.ToolCall{ID: "c1", Name: "shot", Arguments: `{"a":1}`}}}, 0, 16 + 2 + 4 + 7},
		{"nested media in a tool result", chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: "c1", Name: "shot", Parts: []chat.Part{chat.Text{Text: "ok"}, img}}}}, 10, 16 + 2 + 4 + 2 + 40},
		{"marker as rendered", chat.Message{Role: chat.User, Parts: []chat.Part{marker}}, 0, utf8.RuneCountInString(marker.String())},
		{"marker with a recall handle as rendered", chat.Message{Role: chat.User, Parts: []chat.Part{recallable}}, 0, utf8.RuneCountInString(recallable.String())},
		{"marker with its reason as rendered", chat.Message{Role: chat.User, Parts: []chat.Part{chat.Marker{Of: "document", MediaType: "application/pdf", Reason: "too_large"}}}, 0, len("[document removed: application/pdf (too_large)]")},
		{"summary", chat.Message{Role: chat.User, Parts: []chat.Part{chat.Summary{Text: "abc"}}}, 0, 3},
	}
	for _, c := range cases {
		if got := Chars(c.msg, c.est); got != c.want {
			t.Errorf("%s: got %d; want %d", c.name, got, c.want)
		}
	}
	// An image's weight never depends on its size in bytes.
	huge := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Image{Ref: ref, Bytes: 50 << 20}}}
	if Chars(huge, 0) != 6400 {
		t.Fatal("image weight depends on its bytes")
	}
	msgs := []chat.Message{cases[0].msg, cases[1].msg}
	buf := make([]int, 0, 8)
	got := CharCounts(buf, msgs, 0)
	if len(got) != 2 || got[0] != 5 || got[1] != 6400 || &got[0] != &buf[:1][0] {
		t.Fatalf("CharCounts = %v (reused buffer: %v)", got, &got[0] == &buf[:1][0])
	}
}

// A PDF costs its pages: Gemini's documented 258 (2.x) and 560 (3)
// through the profile, Anthropic's measured figure, else the flat estimate.
func TestDocumentTokens(t *testing.T) {
	tbl := Default()
	for model, want := range map[string]int{"gemini-2.5-pro": 3 * 258, "gemini-3-pro-preview": 3 * 560, "claude-sonnet-4-6": 3 * anthropicPageTokens, "gpt-4o": 3 * DefaultImageTokenEstimate} {
		p, ok := tbl.Lookup(model)
		if !ok {
			t.Fatalf("no profile for %s", model)
		}
		if got := DocumentTokens(p, 3); got != want {
			t.Errorf("%s: %d; want %d", model, got, want)
		}
	}
}
