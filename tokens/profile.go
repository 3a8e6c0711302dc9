// Package tokens estimates what content costs a model: model profiles
// (embedded data, overridable in config), the providers' image-token rules,
// offline BPE text counting, and the character accounting compaction uses.
// Estimates plan ahead; the engine's measured usage corrects them.
package tokens

import (
	_ "embed"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/chat"
	"go.yaml.in/yaml/v3"
)

// Profile describes one model family: what it sees, how it prices images and
// text, and the provider's limits and cache rules.
type Profile struct {
	Name          string   `yaml:"name" json:"name"`
	Match         []string `yaml:"match" json:"match,omitempty"`
	Family        string   `yaml:"family" json:"family"`
	ContextWindow int      `yaml:"context_window" json:"context_window"`
	// MaxOutput is the model's output cap in tokens, where known: an agent
	// that reserves room for its answer by it (simulate's opencode row)
	// compacts earlier on a model with a small cap.
	MaxOutput int        `yaml:"max_output,omitempty" json:"max_output,omitempty"`
	Vision    bool       `yaml:"vision" json:"vision"`
	Tokenizer string     `yaml:"tokenizer" json:"tokenizer"` // o200k, cl100k or chars4
	Image     ImageRule  `yaml:"image" json:"image"`
	Limits    Limits     `yaml:"limits" json:"limits"`
	Cache     CacheRules `yaml:"cache" json:"cache"`
	Prices    *Prices    `yaml:"prices,omitempty" json:"prices,omitempty"`
}

// Prices are list prices in US dollars per million tokens, for cost
// reports (imgctx simulate). CacheWrite is the 5-minute write, CacheWrite1h
// the 1-hour one; a provider without write fees leaves them 0.
type Prices struct {
	Input        float64 `yaml:"input" json:"input"`
	Output       float64 `yaml:"output" json:"output"`
	CacheRead    float64 `yaml:"cache_read" json:"cache_read"`
	CacheWrite   float64 `yaml:"cache_write,omitempty" json:"cache_write,omitempty"`
	CacheWrite1h float64 `yaml:"cache_write_1h,omitempty" json:"cache_write_1h,omitempty"`
}

// Dollars is what usage costs at these prices: the prompt tokens not read
// from or written to the cache at the input price, cache writes at the
// 5-minute write price (the input price when it has none), those kept for
// an hour at the 1-hour one (the 5-minute price when it has none).
func (p *Prices) Dollars(u chat.Usage) float64 {
	write := p.CacheWrite
	if write == 0 {
		write = p.Input
	}
	hour := p.CacheWrite1h
	if hour == 0 {
		hour = write
	}
	fresh := max(u.Prompt-u.CacheRead-u.CacheWrite, 0)
	fiveMin := max(u.CacheWrite-u.CacheWriteHour, 0)
	return (float64(fresh)*p.Input + float64(u.CacheRead)*p.CacheRead + float64(fiveMin)*write + float64(u.CacheWriteHour)*hour + float64(u.Output)*p.Output) / 1e6
}

// ImageRule names an image-token rule and carries its parameters; which
// fields matter depends on Rule (see profiles.yaml and provider-rules.md).
type ImageRule struct {
	Rule string `yaml:"rule" json:"rule"`

	// openai_tile
	BaseTokens    int `yaml:"base_tokens,omitempty" json:"base_tokens,omitempty"`
	TileTokens    int `yaml:"tile_tokens,omitempty" json:"tile_tokens,omitempty"`
	TileShortSide int `yaml:"tile_short_side,omitempty" json:"tile_short_side,omitempty"` // default 768

	// openai_patch
	Multiplier float64               `yaml:"multiplier,omitempty" json:"multiplier,omitempty"`
	Levels     map[string]PatchLevel `yaml:"levels,omitempty" json:"levels,omitempty"`
	Auto       string                `yaml:"auto,omitempty" json:"auto,omitempty"` // level used for "auto" and ""

	// anthropic_patch, anthropic_area
	MaxEdge   int `yaml:"max_edge,omitempty" json:"max_edge,omitempty"`
	MaxTokens int `yaml:"max_tokens,omitempty" json:"max_tokens,omitempty"`

	// fixed, gemini_tile
	Tokens    int `yaml:"tokens,omitempty" json:"tokens,omitempty"`
	Tile      int `yaml:"tile,omitempty" json:"tile,omitempty"`
	SmallEdge int `yaml:"small_edge,omitempty" json:"small_edge,omitempty"`

	// gemini_media_resolution (and PDF pages / video frames on Gemini)
	Resolutions map[string]int `yaml:"resolutions,omitempty" json:"resolutions,omitempty"`
	PageTokens  map[string]int `yaml:"page_tokens,omitempty" json:"page_tokens,omitempty"`
	FrameTokens map[string]int `yaml:"frame_tokens,omitempty" json:"frame_tokens,omitempty"`

	// qwen_smart_resize
	Factor       int   `yaml:"factor,omitempty" json:"factor,omitempty"`
	MinPixels    int64 `yaml:"min_pixels,omitempty" json:"min_pixels,omitempty"`
	MaxPixels    int64 `yaml:"max_pixels,omitempty" json:"max_pixels,omitempty"`
	MarkerTokens int   `yaml:"marker_tokens,omitempty" json:"marker_tokens,omitempty"`
}

// PatchLevel is one OpenAI detail level of the patch rule: fit within
// MaxDim pixels, then within Budget patches (0 = no budget).
type PatchLevel struct {
	MaxDim int `yaml:"max_dim,omitempty" json:"max_dim,omitempty"`
	Budget int `yaml:"budget,omitempty" json:"budget,omitempty"`
}

// Limits are the provider's request rules that imgctx checks before sending.
type Limits struct {
	MaxImages         int   `yaml:"max_images,omitempty" json:"max_images,omitempty"`
	MaxImageBytes     int64 `yaml:"max_image_bytes,omitempty" json:"max_image_bytes,omitempty"`
	MaxEdge           int   `yaml:"max_edge,omitempty" json:"max_edge,omitempty"`
	ManyImagesAbove   int   `yaml:"many_images_above,omitempty" json:"many_images_above,omitempty"`
	ManyImagesMaxEdge int   `yaml:"many_images_max_edge,omitempty" json:"many_images_max_edge,omitempty"`
	MaxRequestBytes   int64 `yaml:"max_request_bytes,omitempty" json:"max_request_bytes,omitempty"`
}

// CacheRules describe the provider's prompt cache.
type CacheRules struct {
	MinTokens   int           `yaml:"min_tokens,omitempty" json:"min_tokens,omitempty"`
	Increment   int           `yaml:"increment,omitempty" json:"increment,omitempty"`
	Breakpoints int           `yaml:"breakpoints,omitempty" json:"breakpoints,omitempty"`
	TTL         time.Duration `yaml:"ttl,omitempty" json:"ttl,omitempty"`
	Automatic   bool          `yaml:"automatic,omitempty" json:"automatic,omitempty"`
}

// Table is a set of profiles and the default for unknown models.
type Table struct {
	Version     int               `yaml:"version"`
	DocVersions map[string]string `yaml:"doc_versions"`
	Profiles    []Profile         `yaml:"profiles"`
	Default     Profile           `yaml:"default"`
}

//go:embed profiles.yaml
var embedded []byte

var (
	defaultOnce  sync.Once
	defaultTable *Table
	defaultErr   error
)

// Default returns the embedded profile table. It is parsed once; the result
// is shared and must not be modified (use With to derive another).
func Default() *Table {
	defaultOnce.Do(func() { defaultTable, defaultErr = Parse(embedded) })
	if defaultErr != nil {
		panic("embedded profiles.yaml: " + defaultErr.Error()) // a build defect, caught by tests
	}
	return defaultTable
}

// Parse reads a profile table in the profiles.yaml format and validates it.
func Parse(b []byte) (*Table, error) {
	var t Table
	if err := yaml.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("parse profiles: %w", err)
	}
	if t.Version != 1 {
		return nil, fmt.Errorf("profiles version %d not supported (want 1)", t.Version)
	}
	for _, p := range append(slices.Clone(t.Profiles), t.Default) {
		if err := p.Validate(); err != nil {
			return nil, err
		}
	}
	return &t, nil
}

// With returns a copy of t in which each override replaces the profile of
// the same name, or is added when no profile has that name.
func (t *Table) With(overrides ...Profile) (*Table, error) {
	out := *t
	out.Profiles = slices.Clone(t.Profiles)
	for _, o := range overrides {
		if err := o.Validate(); err != nil {
			return nil, err
		}
		if o.Name == out.Default.Name {
			out.Default = o
			continue
		}
		i := slices.IndexFunc(out.Profiles, func(p Profile) bool { return p.Name == o.Name })
		if i >= 0 {
			out.Profiles[i] = o
		} else {
			out.Profiles = append(out.Profiles, o)
		}
	}
	return &out, nil
}

// Lookup returns the profile whose pattern matches model most specifically
// (most literal characters). A provider prefix ("openai/gpt-4o",
// "models/gemini-2.5-pro") is ignored, and case does not matter.
func (t *Table) Lookup(model string) (Profile, bool) {
	name := strings.ToLower(strings.TrimSpace(model))
	if i := strings.LastIndexByte(name, '/'); i >= 0 {
		name = name[i+1:]
	}
	best, bestScore := -1, -1
	for i, p := range t.Profiles {
		for _, pat := range p.Match {
			if glob(strings.ToLower(pat), name) {
				if s := len(pat) - strings.Count(pat, "*"); s > bestScore {
					best, bestScore = i, s
				}
			}
		}
	}
	if best < 0 {
		return Profile{}, false
	}
	return t.Profiles[best], true
}

// Resolve returns the profile for model, or the conservative default with a
// warning on log (when not nil) when no profile matches.
func (t *Table) Resolve(model string, log *slog.Logger) Profile {
	if p, ok := t.Lookup(model); ok {
		return p
	}
	if log != nil {
		shown := model
		if len(shown) > 128 { // the name is the client's: never log megabytes of it
			shown = fmt.Sprintf("%.128s… (%d bytes)", model, len(model))
		}
		log.Warn("unknown model: using the conservative default profile",
			"model", shown, "context_window", t.Default.ContextWindow, "hint", "add a profile in the config file")
	}
	return t.Default
}

// glob matches name against a pattern in which "*" matches any run of
// characters (including none).
func glob(pattern, name string) bool {
	star := strings.IndexByte(pattern, '*')
	if star < 0 {
		return pattern == name
	}
	if !strings.HasPrefix(name, pattern[:star]) {
		return false
	}
	name, pattern = name[star:], pattern[star+1:]
	if pattern == "" {
		return true
	}
	for i := 0; i <= len(name); i++ {
		if glob(pattern, name[i:]) {
			return true
		}
	}
	return false
}

// Validate checks that a profile has what its rule needs.
func (p Profile) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("profile %q: %s", p.Name, fmt.Sprintf(format, args...))
	}
	if p.Name == "" {
		return fmt.Errorf("profile without a name")
	}
	if p.ContextWindow <= 0 {
		return bad("context_window must be positive")
	}
	switch p.Tokenizer {
	case "o200k", "cl100k", "chars4":
	default:
		return bad("tokenizer %q: want o200k, cl100k or chars4", p.Tokenizer)
	}
	r := p.Image
	switch r.Rule {
	case "none":
	case "openai_tile":
		if r.BaseTokens <= 0 || r.TileTokens <= 0 {
			return bad("openai_tile needs base_tokens and tile_tokens")
		}
	case "openai_patch":
		if r.Multiplier <= 0 || len(r.Levels) == 0 {
			return bad("openai_patch needs multiplier and levels")
		}
		if _, ok := r.Levels[r.Auto]; !ok {
			return bad("openai_patch auto level %q is not among its levels", r.Auto)
		}
	case "anthropic_patch", "anthropic_area":
		if r.MaxEdge <= 0 || r.MaxTokens <= 0 {
			return bad("%s needs max_edge and max_tokens", r.Rule)
		}
	case "fixed":
		if r.Tokens <= 0 {
			return bad("fixed needs tokens")
		}
	case "gemini_tile":
		if r.Tokens <= 0 || r.Tile <= 0 || r.SmallEdge <= 0 {
			return bad("gemini_tile needs tokens, tile and small_edge")
		}
	case "gemini_media_resolution":
		if r.Resolutions["default"] <= 0 {
			return bad("gemini_media_resolution needs resolutions with a default")
		}
	case "qwen_smart_resize":
		if r.Factor <= 0 || r.MinPixels <= 0 || r.MaxPixels < r.MinPixels {
			return bad("qwen_smart_resize needs factor, min_pixels and max_pixels ≥ min_pixels")
		}
	default:
		return bad("unknown image rule %q", r.Rule)
	}
	if p.Vision && r.Rule == "none" {
		return bad("a vision model needs an image rule")
	}
	return nil
}
