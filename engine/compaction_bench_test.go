package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/upstream"
)

// BenchmarkCompactionCost prices one compaction of a 150k-token session
// holding 40 kept 1280×800 screenshots (Anthropic wire, 200k window), with
// the provider's cache warm (cache-sharing: the live prefix plus one
// instruction) and cold (the slimmed side query). It reports the summary
// request's prompt tokens, the share of them the provider reads from cache,
// and dollars at Claude Sonnet's list prices ($3 input, $0.30 cache read,
// $3.75 cache write per million tokens; the summary's output is the same
// either way and left out).
//
//	go test ./engine -run XXX -bench CompactionCost -benchtime 1x
func BenchmarkCompactionCost(b *testing.B) {
	for _, warm := range []bool{true, false} {
		b.Run(fmt.Sprint("warm=", warm), func(b *testing.B) {
			var prompt, cached int
			for range b.N {
				prompt, cached = compactionCost(b, warm)
			}
			dollars := float64(prompt) * 3 / 1e6 // the slimmed query: no cache at all
			if warm {
				dollars = (float64(cached)*0.30 + float64(prompt-cached)*3.75) / 1e6
			}
			b.ReportMetric(float64(prompt), "summary_prompt_tokens")
			b.ReportMetric(float64(cached), "cache_read_tokens")
			b.ReportMetric(dollars, "dollars")
		})
	}
}

func compactionCost(b *testing.B, warm bool) (prompt, cached int) {
	t := &testing.T{}
	r := &rig{dir: b.TempDir()}
	r.up = newScripted(t, upstream.Anthropic, testProfile(200_000))
	b.Cleanup(r.up.srv.Close)
	r.engine = r.open(t)
	now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	r.engine.Now = func() time.Time { return now }
	r.engine.Micro = policy.MicroConfig{Off: true}
	r.engine.Keep.BudgetFraction = 0.5 // room for all 40 screenshots: the session this measures
	m, err := r.engine.NewSession(b.Context(), "acme", chat.Settings{Model: "scripted-vl", KeepTurnImages: true}, chat.Main)
	if err != nil {
		b.Fatal(err)
	}
	call := func(msgs []chat.Message) *Result {
		res, err := r.engine.Call(b.Context(), "acme", m.ID, msgs)
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	for i := range 40 {
		r.up.replies = append(r.up.replies, reply{toolCall: "screenshot"}, reply{text: strings.Repeat("The page shows a form. ", 40)})
		res := call(user(fmt.Sprintf("Step %d: %s", i, strings.Repeat("check the layout ", 500))))
		var id string
		for _, p := range res.Message.Parts {
			if tc, ok := p.(chat.ToolCall); ok {
				id = tc.ID
			}
		}
		call([]chat.Message{{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: id, Name: "screenshot",
			Parts: []chat.Part{chat.Text{Text: "captured"}, chat.Image{URL: screenshot(1280, 800, uint8(i))}}}}}})
		now = now.Add(time.Minute)
	}
	last := r.up.prompts[len(r.up.prompts)-1]
	if !warm {
		now = now.Add(10 * time.Minute)
	}
	// The next request passes the threshold even without its images:
	// compaction is needed, not only eviction.
	r.engine.CompactThreshold = float64(last-40*1334-5000) / 200_000
	r.engine.Keep.BudgetFraction = 0.5
	r.up.replies = append(r.up.replies, reply{text: "Done."})
	call(user("Now summarise what you saw."))
	if len(r.up.summaryCost) != 1 {
		b.Fatalf("%d priced summary requests", len(r.up.summaryCost))
	}
	if warm {
		cached = last // the previous request's whole prompt is the cached prefix
	}
	return r.up.summaryCost[0], cached
}
