package main

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// budgetWindow is the context window the budget run gives every upstream,
// and budgetFraction the share of it kept tool images may use: 2,500
// tokens, one or two 1280×800 screenshots on every wire here (1,334 tokens
// on Claude, 1,002 on Qwen-VL, 910 on GPT-5, 1,032 on Gemini). The window
// is small, yet over the agents' own prompts (claude-code's 18k tokens)
// with eight screenshots, so that window pressure (its own batches, reason
// window) stays out of this check.
const (
	budgetWindow   = 50000
	budgetFraction = 0.05
)

// turns are the two human turns of the budget run: the first reads four
// screenshots, one a request; the resumed session reads four more.
var turns = []struct{ prompt string }{
	{"Read these files one at a time: a-1.png a-2.png a-3.png a-4.png"},
	{"Now read these one at a time: b-1.png b-2.png b-3.png b-4.png"},
}

// budgetRun: every agent, through one imgctx serve with a small window
// and budget and keep.hold off (the budget applies at each turn, the behaviour the
// issue names), reads four screenshots with its own read tool and then,
// resumed, four more. What the upstream gets must show the budget at work
// the same way for all of them, whichever way the agent relays a tool's
// image: during a turn nothing leaves; at the second turn's start the
// first turn's screenshots over the budget leave in one batch as markers;
// the resumed turn is the same conversation.
func budgetRun(bin, work string, shot []byte, up string, atUpstream, atClient *recorded) bool {
	dir := filepath.Join(work, "budget")
	os.MkdirAll(dir, 0o755)
	cfg := filepath.Join(dir, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n"+
		"  - {name: claude, format: anthropic, base_url: %q, models: [\"claude-*\"], context_window: %d}\n"+
		"  - {name: gemini, format: gemini, base_url: %q, context_window: %d}\n"+
		"  - {name: local, format: openai, base_url: %q, context_window: %d}\n"+
		"keep: {hold: false, budget_fraction: %g}\n", up, budgetWindow, up, budgetWindow, up, budgetWindow, budgetFraction)), 0o644)
	serve, gw := start(bin, filepath.Join(dir, "data"), "--config", cfg)
	defer serve.Process.Kill()
	front := recording(atClient, gw, gw)
	count := conversations(filepath.Join(dir, "data"))

	fmt.Printf("Budget: every upstream's window %d tokens, keep.budget_fraction %g, keep.hold off (the budget applies at each turn); two human turns, the second a resumed session, of four screenshots each, read one a request by the agent's own tool.\n\n", budgetWindow, budgetFraction)
	fmt.Println("| agent | requests of the two turns | screenshots sent a request | markers a request | removed at the second turn's start | kept | with nothing removed, byte-identical at the upstream | the main requests' conversations (request log), conversations added (side requests too) | as budgeted |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	ok := true
	for _, a := range agents {
		adir := filepath.Join(dir, a.folder())
		os.MkdirAll(adir, 0o755)
		for i, t := range []string{"a", "b"} {
			for n := 1; n <= 4; n++ {
				os.WriteFile(filepath.Join(adir, fmt.Sprintf("%s-%d.png", t, n)), variant(shot, i*4+n), 0o644)
			}
		}
		setWorkdir(adir)
		env := env(front, filepath.Join(dir, "home", a.folder()))
		convs, at, clientAt := count(), atUpstream.count(), atClient.count()
		var answers []string
		for i, t := range turns {
			answers = append(answers, lastLine(a.run(adir, env, a.ask(t.prompt, i > 0, front)...)))
		}
		time.Sleep(1500 * time.Millisecond)
		sent := atUpstream.since(at)
		seq := readTurns(sent)
		// The main requests' conversations, from the request log; and
		// those whose upstream body has no marker must have reached it
		// byte for byte.
		keys := map[string]bool{}
		unchanged, whole := 0, 0
		for i, b := range atClient.since(clientAt) {
			if tool, _ := readTool(b); tool == "" || !readPrompt.Match(b) {
				continue
			}
			keys[conversationOf(filepath.Join(dir, "data"), clientAt+i)] = true
			if j := slices.IndexFunc(sent, func(s []byte) bool { return bytes.Equal(s, b) }); j >= 0 {
				unchanged++
			}
		}
		for _, b := range sent {
			if readPrompt.Match(b) && !bytes.Contains(b, []byte("[image removed")) {
				if tool, _ := readTool(b); tool != "" {
					whole++
				}
			}
		}
		verdict := seq.check()
		switch {
		case !strings.Contains(answers[1], "scripted upstream"):
			verdict = "the resumed turn did not end: " + answers[1]
		case len(keys) != 1:
			verdict = fmt.Sprintf("the main requests are %d conversations in the request log", len(keys))
		case unchanged != whole:
			verdict = fmt.Sprintf("%d of %d requests with nothing removed reached the upstream unchanged", unchanged, whole)
		}
		ok = ok && verdict == "yes"
		fmt.Printf("| %s | %d + %d | %s | %s | %d | %d | %d of %d | %d, %d | %s |\n", a, len(seq[0]), len(seq[1]), seq.column(func(r request) int { return r.images }),
			seq.column(func(r request) int { return r.markers }), seq.removed(), seq.kept(), unchanged, whole, len(keys), count()-convs, verdict)
	}
	return ok
}

// request is what one request of a turn carried.
type request struct{ images, markers int }

// turnSeq is a run's requests of each turn, side requests left out.
type turnSeq [2][]request

func readTurns(bodies [][]byte) turnSeq {
	var seq turnSeq
	for _, b := range bodies {
		m := readPrompt.FindAllSubmatch(b, -1)
		if m == nil {
			continue
		}
		tool, _ := readTool(b)
		if tool == "" {
			continue // a side request quoting the prompt
		}
		t := 0
		if bytes.HasPrefix(m[len(m)-1][1], []byte("b-")) {
			t = 1
		}
		seq[t] = append(seq[t], request{len(base64Image.FindAll(b, -1)), bytes.Count(b, []byte("[image removed"))})
	}
	return seq
}

// check says "yes" when the run was budgeted as it should be: each turn
// reads its four screenshots one a request (five requests); nothing
// leaves during a turn; at the second turn's start, one batch of markers;
// then none more. Else what went otherwise.
func (s turnSeq) check() string {
	for t, reqs := range s {
		if len(reqs) != 5 {
			return fmt.Sprintf("turn %d: %d requests, not 5", t+1, len(reqs))
		}
		for i, r := range reqs {
			if r.markers != reqs[0].markers {
				return fmt.Sprintf("turn %d: request %d removed images mid-turn", t+1, i+1)
			}
			if i > 0 && r.images != reqs[i-1].images+1 {
				return fmt.Sprintf("turn %d: request %d carries %d screenshots after %d", t+1, i+1, r.images, reqs[i-1].images)
			}
		}
	}
	switch {
	case s[0][0].markers != 0:
		return "markers before any removal"
	case s.removed() == 0:
		return "nothing removed at the second turn's start"
	case s.kept()+s.removed() < 4:
		return fmt.Sprintf("the second turn starts with %d screenshots and %d markers, not the first turn's 4", s.kept(), s.removed())
	}
	return "yes"
}

func (s turnSeq) removed() int {
	if len(s[1]) == 0 {
		return 0
	}
	return s[1][0].markers
}

func (s turnSeq) kept() int {
	if len(s[1]) == 0 {
		return 0
	}
	return s[1][0].images
}

func (s turnSeq) column(f func(request) int) string {
	var turns []string
	for _, reqs := range s {
		var n []string
		for _, r := range reqs {
			n = append(n, fmt.Sprint(f(r)))
		}
		turns = append(turns, strings.Join(n, " "))
	}
	return strings.Join(turns, " · ")
}

// variant is the screenshot with a band of its first row recoloured by n:
// another image, as big, for each file the run reads.
func variant(shot []byte, n int) []byte {
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		panic(err)
	}
	rgba := image.NewRGBA(img.Bounds())
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y++ {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x++ {
			rgba.Set(x, y, img.At(x, y))
		}
	}
	for x := 0; x < 64; x++ {
		rgba.Set(x+64*n, 0, color.RGBA{uint8(40 * n), 0, uint8(255 - 20*n), 255})
	}
	var out bytes.Buffer
	png.Encode(&out, rgba)
	return out.Bytes()
}
