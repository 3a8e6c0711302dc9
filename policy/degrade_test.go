package policy

import (
	"testing"

	"github.com/imgctx/imgctx/tokens"
)

// Degrade before remove (BENCHMARKS.md "Policies", item 4 of price-aware
// eviction) is not built because of what this checks: on every built-in
// profile a smaller copy of a screenshot costs at least as many tokens per
// pixel the model sees as the screenshot itself, so keeping a copy in
// place of a removal buys sight at the full image's price or dearer, and
// its break is the removal's. Should a profile ever price a copy's pixels
// cheaper, this fails, and the question is open again.
func TestASmallerCopyIsNeverCheaperPerPixelSeen(t *testing.T) {
	screens := [][2]int{{1280, 800}, {1366, 768}, {1440, 900}, {1920, 1080}, {1024, 768}, {2560, 1440}}
	tbl := tokens.Default()
	for _, p := range append(tbl.Profiles, tbl.Default) {
		if r := p.Image.Rule; r == "" || r == "none" || r == "fixed" || r == "gemini_media_resolution" {
			continue // no image, or a price that ignores the size: a copy saves nothing
		}
		for _, s := range screens {
			full, err := tokens.EstimateImage(p, s[0], s[1], "")
			if err != nil {
				continue // this profile refuses the screen
			}
			for _, scale := range []int{2, 3, 4} {
				small, err := tokens.EstimateImage(p, s[0]/scale, s[1]/scale, "")
				if err != nil {
					continue
				}
				perFull := float64(full.Tokens) / float64(full.Width*full.Height)
				perSmall := float64(small.Tokens) / float64(small.Width*small.Height)
				if perSmall < 0.97*perFull {
					t.Errorf("%s: a 1/%d copy of %d×%d costs %d tokens for %d×%d seen (%.5f a pixel), the image %d for %d×%d (%.5f): a copy is cheaper per pixel",
						p.Name, scale, s[0], s[1], small.Tokens, small.Width, small.Height, perSmall, full.Tokens, full.Width, full.Height, perFull)
				}
			}
		}
	}
}
