package sim

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
)

// opencode's tail, by hand: the newest whole turns within the budget; in
// the newest turn that does not fit, the messages after its last
// screenshot; none when the turn ends on one.
func TestOpencodeTail(t *testing.T) {
	shot := &Image{W: 1280, H: 800, B64: strings.Repeat("A", 280_000)} // a screenshot's base64
	human := func(text string) Msg { return Msg{Role: "user", Human: true, Parts: []Part{{Text: text}}} }
	call := Msg{Role: "assistant", Parts: []Part{{Text: "Looking.", Call: &Call{ID: "c", Name: "screenshot", Input: "{}"}}}}
	result := Msg{Role: "user", Parts: []Part{{Result: &Result{CallID: "c", Parts: []Part{{Text: "taken"}, {Image: shot}}}}}}
	answer := Msg{Role: "assistant", Parts: []Part{{Text: strings.Repeat("word ", 200)}}}
	for _, c := range []struct {
		name string
		msgs []Msg
		want int
	}{
		{"the newest turns whole, none of the one before that ends on its screenshot", []Msg{human("one"), call, result, human("two"), answer, human("three"), answer}, 3},
		{"the newest turns whole, and the one before from after its screenshot", []Msg{human("one"), call, result, answer, human("two"), answer, human("three"), answer}, 3},
		{"the newest turn from after its screenshot", []Msg{human("one"), answer, human("two"), call, result, answer, answer}, 5},
		{"the newest turn ends on a screenshot", []Msg{human("one"), answer, human("two"), call, result}, 0},
		{"everything fits: no tail, as opencode keeps none from the first message", []Msg{human("one"), answer}, 0},
	} {
		if got := tailStart(c.msgs, 15000); got != c.want {
			t.Errorf("%s: the tail starts at %d; want %d", c.name, got, c.want)
		}
	}
	text := transcriptText([]Msg{human("Open the page."), call, result, {Role: "user", Parts: []Part{{Result: &Result{CallID: "d", Parts: []Part{{Text: strings.Repeat("x", 5000)}}}}}}})
	for _, want := range []string{"[User]: Open the page.", "[Assistant tool call]: screenshot({})", "[Tool result]: taken\n[Attached image/png: file]", strings.Repeat("x", 2000) + "\n[truncated]"} {
		if !strings.Contains(text, want) {
			t.Errorf("the transcript lacks %q", want)
		}
	}
	if strings.Contains(text, "AAAA") || strings.Contains(text, strings.Repeat("x", 2001)) {
		t.Error("the transcript carries an image's bytes or a tool output past 2,000 characters")
	}
}

// The opencode row on gpt-4o (output cap 16,384) with a window the
// workload outgrows: it compacts at the window less 16,384, its summary
// requests carry neither an image nor the agent's system prompt, and after
// each the history holds no image from before it.
func TestOpencodeCompactsByItsReserve(t *testing.T) {
	prof := gpt4o(t)
	prof.ContextWindow = 40_000
	w := smallTrace(t, 8, 5, 0)
	var mu sync.Mutex
	var summaries [][]byte
	rep, err := Run(context.Background(), Config{Workload: w, Model: prof.Name, Profile: prof, Policies: []string{"opencode"}, NoFrontier: true,
		Received: func(policy string, b []byte) {
			if bytes.Contains(b, []byte("[Tool result]: ")) {
				mu.Lock()
				summaries = append(summaries, bytes.Clone(b))
				mu.Unlock()
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	oc := row(rep, "opencode")
	if oc.Compactions == 0 || oc.Compactions != len(summaries) || oc.Failed != 0 {
		t.Fatalf("%d compactions, %d summary requests, %d failed", oc.Compactions, len(summaries), oc.Failed)
	}
	agentSystem := []byte(`{"role":"system","content":"` + w.System[:100])
	for _, s := range summaries {
		if bytes.Contains(s, []byte(";base64,")) || bytes.Contains(s, agentSystem) || !bytes.Contains(s, []byte("[Attached image/png: file]")) || !bytes.Contains(s, []byte(`"tools":[]`)) {
			t.Fatalf("a summary request with an image, the agent's system prompt or its tools, or no image named: %.300s", s)
		}
	}
	// Compacting before a request that would reach the usable window, it
	// sends none much past it (one step's estimate off at most), and gets
	// past where a 32,000-token reserve would have stopped it: gpt-4o's cap
	// is the smaller.
	if usable := prof.ContextWindow - prof.MaxOutput; oc.Removed["compaction"] == 0 || oc.LargestPrompt >= usable+1000 || oc.LargestPrompt <= prof.ContextWindow-32000+1000 {
		t.Fatalf("removed %v, largest prompt %d against %d usable", oc.Removed, oc.LargestPrompt, usable)
	}
}
