package tokens

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// vector is one entry of shared/reference/image-token-vectors.json.
type vector struct {
	Model        string  `json:"model"`
	Width        *int    `json:"width"`
	Height       *int    `json:"height"`
	Detail       *string `json:"detail"`
	Tokens       int     `json:"tokens"`
	Resized      []int   `json:"resized"`
	Tiles        int     `json:"tiles"`
	Patches      int     `json:"patches"`
	BaseTokens   int     `json:"base_tokens"`
	TileTokens   int     `json:"tile_tokens"`
	PatchBudget  int     `json:"patch_budget"`
	MaxDimension *int    `json:"max_dimension"`
	Multiplier   float64 `json:"multiplier"`
	Media        string  `json:"media"`
	Factor       int     `json:"factor"`
	MinPixels    int64   `json:"min_pixels"`
	MaxPixels    int64   `json:"max_pixels"`
	WithMarkers  int     `json:"tokens_with_vision_bos_eos"`
	Approximate  bool    `json:"approximate"`
	Note         string  `json:"note"`
}

const vectorsFile = "testdata/image-token-vectors.json"

// The vectors are the providers' documented examples. The copy under
// testdata must match shared/reference whenever that folder is beside the
// checkout (it is for developers and CI).
func TestVectorsCopyIsCurrent(t *testing.T) {
	shared, err := os.ReadFile("../../shared/reference/image-token-vectors.json")
	if err != nil {
		t.Skip("shared/reference not beside this checkout")
	}
	mine, _ := os.ReadFile(vectorsFile)
	if !bytes.Equal(shared, mine) {
		t.Fatal("tokens/testdata/image-token-vectors.json differs from shared/reference: copy it again")
	}
}

func loadVectors(t *testing.T) map[string][]vector {
	b, err := os.ReadFile(vectorsFile)
	if err != nil {
		t.Fatal(err)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	out := map[string][]vector{}
	for k, v := range raw {
		if k == "_meta" {
			continue
		}
		var vs []vector
		if err := json.Unmarshal(v, &vs); err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		out[k] = vs
	}
	return out
}

func deref[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

func mustProfile(t *testing.T, name string) Profile {
	t.Helper()
	for _, p := range Default().Profiles {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no shipped profile %q", name)
	return Profile{}
}

// profileFor maps a vector's model description to the shipped profile that
// must reproduce it. Descriptive names ("claude (standard tier ...)") map by
// their wording; real model names go through Lookup like any request.
func profileFor(t *testing.T, section string, v vector) Profile {
	t.Helper()
	m := v.Model
	switch {
	case strings.HasPrefix(m, "any 1536-patch-budget model"):
		// A generic example: the rule with the vector's own parameters.
		return Profile{Name: "vector", Image: ImageRule{Rule: "openai_patch", Multiplier: v.Multiplier,
			Levels: map[string]PatchLevel{"high": {MaxDim: deref(v.MaxDimension), Budget: v.PatchBudget}}, Auto: "high"}}
	case strings.Contains(m, "standard tier"):
		return mustProfile(t, "claude-standard")
	case strings.Contains(m, "high-resolution tier"):
		return mustProfile(t, "claude-high-resolution")
	case strings.Contains(m, "legacy formula"):
		return mustProfile(t, "claude-3")
	case strings.HasPrefix(m, "gemini-2.0-flash"), strings.HasPrefix(m, "gemini-1.5 / 2.x"):
		return mustProfile(t, "gemini-2")
	case strings.HasPrefix(m, "gemini-3"):
		return mustProfile(t, "gemini-3")
	case strings.HasPrefix(m, "Qwen2-VL (HF preprocessor defaults)"):
		return mustProfile(t, "qwen2-vl")
	}
	p, ok := Default().Lookup(m)
	if !ok {
		t.Fatalf("%s: no profile for vector model %q", section, m)
	}
	return p
}

func TestImageTokenVectors(t *testing.T) {
	sections := loadVectors(t)
	checked := 0
	for _, section := range []string{"openai_tile", "openai_patch", "anthropic", "gemini", "qwen_vl"} {
		for _, v := range sections[section] {
			name := section + "/" + v.Model + "/" + deref(v.Detail)
			t.Run(name, func(t *testing.T) {
				p := profileFor(t, section, v)
				w, h, detail := deref(v.Width), deref(v.Height), deref(v.Detail)
				// The file annotates some values for people: "X (default)".
				detail, _, _ = strings.Cut(detail, " (")
				// The profile's parameters are the documented ones.
				if v.BaseTokens != 0 && (p.Image.BaseTokens != v.BaseTokens || p.Image.TileTokens != v.TileTokens) {
					t.Fatalf("profile %s has base/tile %d/%d; vector says %d/%d", p.Name, p.Image.BaseTokens, p.Image.TileTokens, v.BaseTokens, v.TileTokens)
				}
				if section == "openai_patch" {
					lv := p.Image.Levels[strings.ToLower(detail)]
					if lv.Budget != v.PatchBudget || lv.MaxDim != deref(v.MaxDimension) || p.Image.Multiplier != v.Multiplier {
						t.Fatalf("profile %s level %q = %+v ×%v; vector says budget %d, max %d, ×%v", p.Name, detail, lv, p.Image.Multiplier, v.PatchBudget, deref(v.MaxDimension), v.Multiplier)
					}
				}
				if v.Factor != 0 && (p.Image.Factor != v.Factor || p.Image.MinPixels != v.MinPixels || p.Image.MaxPixels != v.MaxPixels) {
					t.Fatalf("profile %s smart_resize params differ from the vector's", p.Name)
				}

				var got int
				var est Estimate
				switch {
				case strings.HasPrefix(v.Media, "pdf page"):
					n, ok := PageTokens(p, detail)
					if !ok {
						t.Fatalf("profile %s has no page price", p.Name)
					}
					got = n
				case v.Media == "video frame":
					n, err := level(p.Image.FrameTokens, detail)
					if err != nil || n == 0 {
						t.Fatalf("profile %s has no frame price", p.Name)
					}
					got = n
				default:
					var err error
					est, err = EstimateImage(p, w, h, detail)
					if err != nil {
						t.Fatal(err)
					}
					got = est.Tokens
				}
				want := v.Tokens
				if v.WithMarkers != 0 {
					if got != v.WithMarkers {
						t.Fatalf("tokens with vision markers: got %d; want %d", got, v.WithMarkers)
					}
					got -= p.Image.MarkerTokens
				}
				if got != want {
					t.Fatalf("tokens: got %d; want %d (resized %d×%d)", got, want, est.Width, est.Height)
				}
				if len(v.Resized) == 2 && (est.Width != v.Resized[0] || est.Height != v.Resized[1]) {
					t.Fatalf("resized: got %d×%d; want %d×%d", est.Width, est.Height, v.Resized[0], v.Resized[1])
				}
				if v.Tiles != 0 && est.Units != v.Tiles {
					t.Fatalf("tiles: got %d; want %d", est.Units, v.Tiles)
				}
				if v.Patches != 0 && est.Units != v.Patches {
					t.Fatalf("patches: got %d; want %d", est.Units, v.Patches)
				}
			})
			checked++
		}
	}
	total := 0
	for _, vs := range sections {
		total += len(vs)
	}
	if checked != total || total < 50 {
		t.Fatalf("checked %d of %d vectors", checked, total)
	}
}
