package gateway

import (
	"encoding/base64"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/upstream"
	"pgregory.net/rapid"
)

// Issue "Drop-in that survives agents changing", item 2, as a property: an
// OpenAI-wire conversation whose tool screenshots are relayed in a user
// message after the tool message — images alone, beside qwen-code's
// "Attached media from tool result:" text, or split over two messages,
// each round its own way — gets the same decisions as the same
// conversation relayed the first way throughout: at the last request,
// the same images sent and the same markers, in the same order.
func TestProxyRelayShapesGetTheSameDecisions(t *testing.T) {
	raw, _ := samplePNG(t)
	rapid.Check(t, func(rt *rapid.T) {
		turns := rapid.IntRange(1, 3).Draw(rt, "turns")
		var rounds [][]int // per round, its screenshots' numbers
		var perTurn []int
		n := 0
		for range turns {
			r := rapid.IntRange(1, 3).Draw(rt, "rounds")
			perTurn = append(perTurn, r)
			for range r {
				var shots []int
				for range rapid.IntRange(1, 2).Draw(rt, "shots") {
					n++
					shots = append(shots, n)
				}
				rounds = append(rounds, shots)
			}
		}
		shapes := make([]int, len(rounds))
		for i := range shapes {
			shapes[i] = rapid.IntRange(0, 2).Draw(rt, "shape")
		}
		keep := rapid.SampledFrom([]string{"on", "off"}).Draw(rt, "keep")
		reference := run(t, raw, perTurn, rounds, make([]int, len(rounds)), keep)
		if got := run(t, raw, perTurn, rounds, shapes, keep); got != reference {
			rt.Fatalf("shapes %v, keep %s: the last request sends\n%s\nrelayed as images alone it sends\n%s", shapes, keep, got, reference)
		}
	})
}

var sentImage = regexp.MustCompile(`image_url|\[image removed[^\]]*\]`)

// run plays the conversation through a fresh gateway and returns what its
// last upstream request carried in place of each screenshot.
func run(t *testing.T, raw []byte, perTurn []int, rounds [][]int, shapes []int, keep string) string {
	g := newGW(t, upstream.OpenAI, nil)
	var msgs []string
	header := []string{"X-Imgctx-Keep-Turn-Images", keep, "X-Imgctx-Session", "relay"}
	send := func() {
		resp, b := g.do(t, "POST", "/v1/chat/completions", "", []byte(`{"model":"tiny-vision","messages":[`+strings.Join(msgs, ",")+`]}`), header...)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	}
	img := func(k int) string {
		return `{"type":"image_url","image_url":{"url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString(distinctPNG(raw, k)) + `"}}`
	}
	r := 0
	for turn, count := range perTurn {
		msgs = append(msgs, fmt.Sprintf(`{"role":"user","content":"step %d"}`, turn))
		for range count {
			id := fmt.Sprintf("c%d", r)
			msgs = append(msgs, `{"role":"assistant","content":null,"tool_calls":[{"id":"`+id+`","type":"function","function":{"name":"screenshot","arguments":"{}"}}]}`,
				`{"role":"tool","tool_call_id":"`+id+`","content":"taken"}`)
			var parts []string
			for _, k := range rounds[r] {
				parts = append(parts, img(k))
			}
			switch shapes[r] {
			case 0:
				msgs = append(msgs, `{"role":"user","content":[`+strings.Join(parts, ",")+`]}`)
			case 1:
				msgs = append(msgs, `{"role":"user","content":[{"type":"text","text":"Attached media from tool result:"},`+strings.Join(parts, ",")+`]}`)
			case 2:
				msgs = append(msgs, `{"role":"user","content":[{"type":"text","text":"Attached media from tool result:"}]}`, `{"role":"user","content":[`+strings.Join(parts, ",")+`]}`)
			}
			send()
			r++
		}
		msgs = append(msgs, `{"role":"assistant","content":"done"}`)
	}
	msgs = append(msgs, `{"role":"user","content":"and now?"}`)
	send()
	up := g.up.received()
	return strings.Join(sentImage.FindAllString(string(up[len(up)-1]), -1), "\n")
}

// The same property on the Gemini wire: a tool's screenshot nested in its
// functionResponse or beside it in the same content (gemini-cli sends
// both), each round its own way, keep on or off, gets the same decisions
// as nested throughout — what the last request carries in place of each
// screenshot is the same.
func TestGeminiRelayShapesGetTheSameDecisions(t *testing.T) {
	raw, _ := samplePNG(t)
	rapid.Check(t, func(rt *rapid.T) {
		perTurn, rounds := drawTurns(rt)
		beside := make([]bool, rounds)
		for i := range beside {
			beside[i] = rapid.Bool().Draw(rt, "beside")
		}
		keep := rapid.SampledFrom([]string{"on", "off"}).Draw(rt, "keep")
		reference := geminiRun(t, raw, perTurn, make([]bool, rounds), keep)
		decided(rt, keep, rounds, reference)
		if got := geminiRun(t, raw, perTurn, beside, keep); got != reference {
			rt.Fatalf("beside %v, keep %s: the last request sends\n%s\nnested throughout it sends\n%s", beside, keep, got, reference)
		}
	})
}

// drawTurns draws 1 to 3 human turns of 1 to 3 tool rounds each, one
// screenshot a round: the rounds of each turn, and how many in all.
func drawTurns(rt *rapid.T) (perTurn []int, rounds int) {
	for range rapid.IntRange(1, 3).Draw(rt, "turns") {
		r := rapid.IntRange(1, 3).Draw(rt, "rounds")
		perTurn = append(perTurn, r)
		rounds += r
	}
	return perTurn, rounds
}

// decided fails a run whose reference removed no screenshot where the
// budget (one screenshot) or keep off must have: the shapes would then be
// compared on no decision at all.
func decided(rt *rapid.T, keep string, rounds int, reference string) {
	if (keep == "off" || rounds > 1) && !strings.Contains(reference, "[image removed") {
		rt.Fatalf("keep %s, %d rounds: no screenshot was removed, so the shapes were not compared on a decision:\n%s", keep, rounds, reference)
	}
}

var geminiSent = regexp.MustCompile(`"inlineData"|\[image removed[^\]]*\]`)

// geminiRun plays the conversation through a fresh gateway (budget: one
// screenshot) and returns what its last upstream request carried in place
// of each screenshot.
func geminiRun(t *testing.T, raw []byte, perTurn []int, beside []bool, keep string) string {
	up, _, _, url := newGeminiRig(t, 20_000, nil)
	g := &geminiCLI{t: t, url: url, png: raw, header: map[string]string{"X-Imgctx-Keep-Turn-Images": keep}}
	r := 0
	for turn, count := range perTurn {
		g.user(fmt.Sprintf("step %d", turn))
		g.call(up, "generateContent", reply{tools: 1})
		for i := range count {
			g.beside = beside[r]
			g.screenshot()
			next := reply{tools: 1}
			if i == count-1 {
				next = reply{}
			}
			g.call(up, "generateContent", next)
			r++
		}
	}
	g.user("and now?")
	g.call(up, "generateContent", reply{})
	return strings.Join(geminiSent.FindAllString(string(g.sent[len(g.sent)-1]), -1), "\n")
}

// The same property on the Responses wire: a tool's screenshot inside its
// function_call_output, or relayed in a user message after a text-only
// output (alone, or beside "Attached media from tool result:"), each round
// its own way, keep on or off, gets the same decisions as inside the
// output throughout.
func TestResponsesRelayShapesGetTheSameDecisions(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		perTurn, rounds := drawTurns(rt)
		shapes := make([]int, rounds)
		for i := range shapes {
			shapes[i] = rapid.IntRange(0, 2).Draw(rt, "shape")
		}
		keep := rapid.SampledFrom([]string{"on", "off"}).Draw(rt, "keep")
		reference := responsesRun(t, perTurn, make([]int, rounds), keep)
		decided(rt, keep, rounds, reference)
		if got := responsesRun(t, perTurn, shapes, keep); got != reference {
			rt.Fatalf("shapes %v, keep %s: the last request sends\n%s\ninside the outputs throughout it sends\n%s", shapes, keep, got, reference)
		}
	})
}

var responsesSent = regexp.MustCompile(`"input_image"|\[image removed[^\]]*\]`)

func responsesRun(t *testing.T, perTurn []int, shapes []int, keep string) string {
	rig := newResponsesRig(t, 20_000) // budget: one screenshot
	c := rig.codex(t, "relay", false)
	c.header["X-Imgctx-Keep-Turn-Images"] = keep
	r := 0
	for turn, count := range perTurn {
		c.user(fmt.Sprintf("step %d", turn))
		c.post(rig.up, reply{tools: 1})
		for i := range count {
			c.shots++
			image := `{"type":"input_image","image_url":"data:image/png;base64,` + base64.StdEncoding.EncodeToString(distinctPNG(c.png, c.shots)) + `","detail":"high"}`
			id := c.pending[0]
			switch shapes[r] {
			case 0:
				c.items = append(c.items, `{"type":"function_call_output","call_id":"`+id+`","output":[{"type":"input_text","text":"saved screen.png"},`+image+`]}`)
			case 1:
				c.items = append(c.items, `{"type":"function_call_output","call_id":"`+id+`","output":"saved screen.png"}`,
					`{"type":"message","role":"user","content":[`+image+`]}`)
			case 2:
				c.items = append(c.items, `{"type":"function_call_output","call_id":"`+id+`","output":"saved screen.png"}`,
					`{"type":"message","role":"user","content":[{"type":"input_text","text":"Attached media from tool result:"},`+image+`]}`)
			}
			next := reply{tools: 1}
			if i == count-1 {
				next = reply{}
			}
			c.post(rig.up, next)
			r++
		}
	}
	c.user("and now?")
	c.post(rig.up, reply{})
	return strings.Join(responsesSent.FindAllString(string(c.sent[len(c.sent)-1]), -1), "\n")
}
