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

var sentImage = regexp.MustCompile(`image_url|\[image removed: [^\]]*\]`)

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
