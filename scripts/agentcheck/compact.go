package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The opencode compaction check's model limits: opencode compacts once a
// step's prompt reaches the context less the room it keeps for the answer,
// min(32,000, the output limit), and asks for that room as max_tokens.
const (
	compactContext = 50000
	compactOutput  = 8000
)

// compactionRun checks what imgctx simulate's opencode row reproduces
// (sim/opencode.go) against opencode itself, through imgctx serve: the
// scripted upstream reports the request that carries the screenshot as a
// prompt past opencode's compaction point, and opencode must then
// summarise as the row does — one request with no tools and no image, the
// history as a text transcript naming the image — and go on with the
// summary, no screenshot (its tail budget counts base64) and its continue
// message; every main request asks for min(32,000, the output limit) as
// max_tokens.
func compactionRun(bin, work, up string, atUpstream *recorded) bool {
	oc := newest("opencode")
	if !slices.Contains(agents, oc) {
		return true
	}
	dir := filepath.Join(work, "compaction")
	os.MkdirAll(dir, 0o755)
	shot, _ := os.ReadFile(filepath.Join(work, "screenshot.png"))
	os.WriteFile(filepath.Join(dir, "screenshot.png"), shot, 0o644)
	cfg := filepath.Join(dir, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: local, format: openai, base_url: %q}\n", up)), 0o644)
	serve, gw := start(bin, filepath.Join(dir, "data"), "--config", cfg)
	defer serve.Process.Kill()
	env := append(env(gw.String(), filepath.Join(dir, "home")),
		"OPENCODE_CONFIG_CONTENT="+opencodeConfigWith(gw.String(), "", fmt.Sprintf(`{"context":%d,"output":%d}`, compactContext, compactOutput)))
	setWorkdir(dir)
	defer inflated.Store(0)
	// A session whose screenshot request reports prompt tokens.
	session := func(prompt int) (string, [][]byte) {
		inflated.Store(int64(prompt))
		before := atUpstream.count()
		out := oc.run(dir, env, oc.ask("Describe screenshot.png", false, gw.String())...)
		return out, atUpstream.since(before)
	}
	reserve := min(32000, compactOutput)
	at := compactContext - reserve // where it compacts: 42,000, under 90% of the context
	_, underBodies := session(at - 1000)
	out, sent := session(at + 1000)
	under, reqs := readChats(underBodies), readChats(sent)
	summarised := slices.ContainsFunc(under, chatRequest.summary)

	fmt.Printf("Compaction: %s (%s) with a model of %d tokens of context and %d of output, through imgctx serve; the upstream reports the request carrying the screenshot as a prompt of %d tokens, one session; then of %d, another.\n\n",
		oc, oc.wire, compactContext, compactOutput, at-1000, at+1000)
	fmt.Printf("Reported %d: %d requests, a summary among them: %v. Reported %d:\n\n", at-1000, len(under), summarised, at+1000)
	fmt.Println("| request | tools | messages | images | max_tokens | what it is |")
	fmt.Println("|---|---|---|---|---|---|")
	for i, r := range reqs {
		what := "main"
		switch {
		case r.summary():
			what = "summary (a transcript)"
		case r.tools == 0:
			what = "side (no tools)"
		case bytes.Contains(r.body, []byte(opencodeContinue)):
			what = "main, after the summary"
		}
		fmt.Printf("| %d | %d | %d | %d | %d | %s |\n", i+1, r.tools, len(r.messages), r.images, r.maxTokens, what)
	}
	// The request carrying the screenshot, the summary after it, and a
	// main request after that.
	shotAt := slices.IndexFunc(reqs, func(r chatRequest) bool { return r.tools > 0 && r.images > 0 })
	sumAt, afterAt := -1, -1
	if shotAt >= 0 {
		for i := shotAt + 1; i < len(reqs); i++ {
			if reqs[i].summary() && sumAt < 0 {
				sumAt = i
			} else if sumAt >= 0 && reqs[i].tools > 0 && afterAt < 0 {
				afterAt = i
			}
		}
	}
	return report([]check{
		{fmt.Sprintf("under the context less the room it keeps (%d), no summary", at), !summarised && len(under) > 0},
		{"past it, the screenshot reached the upstream in a main request", shotAt >= 0},
		{fmt.Sprintf("every main request of both sessions asks for max_tokens %d, the room it keeps", reserve),
			!slices.ContainsFunc(append(under, reqs...), func(r chatRequest) bool { return !r.parsed || r.tools > 0 && r.maxTokens != reserve })},
		{"then a summary request: its own system prompt, no tools, no image, one user message holding the history as a transcript that names the image",
			sumAt > 0 && reqs[sumAt].images == 0 && !base64Image.Match(reqs[sumAt].body) &&
				slices.Equal(roles(reqs[sumAt].messages), []string{"system", "user"}) && strings.Contains(text(reqs[sumAt].messages[1]), "[Attached image/png: file]")},
		{"then a main request of the summary (asked for and answered), no screenshot, and the continue message", afterAt > 0 && reqs[afterAt].images == 0 &&
			slices.Equal(roles(reqs[afterAt].messages), []string{"system", "user", "assistant", "user"}) &&
			text(reqs[afterAt].messages[1]) == "What did we do so far?" && text(reqs[afterAt].messages[2]) == answer &&
			strings.HasPrefix(text(reqs[afterAt].messages[3]), opencodeContinue)},
	}, fmt.Sprintf("its answer: %q", strings.TrimSpace(lastLine(out))))
}

// chatRequest is what the compaction check reads of a Chat Completions
// body.
type chatRequest struct {
	tools, images, maxTokens int
	messages                 []json.RawMessage
	body                     []byte
	parsed                   bool
}

func readChats(bodies [][]byte) []chatRequest {
	var out []chatRequest
	for _, b := range bodies {
		var req struct {
			Tools     []json.RawMessage `json:"tools"`
			Messages  []json.RawMessage `json:"messages"`
			MaxTokens int               `json:"max_tokens"`
		}
		err := json.Unmarshal(b, &req)
		out = append(out, chatRequest{len(req.Tools), len(dataURL.FindAll(b, -1)), req.MaxTokens, req.Messages, b, err == nil})
	}
	return out
}

// summary: opencode's summary request, with no tools and the history as a
// transcript that names its images.
func (r chatRequest) summary() bool {
	return r.tools == 0 && bytes.Contains(r.body, []byte("[Attached image/png"))
}

// check is one line of a compaction check.
type check struct {
	what string
	ok   bool
}

// report prints the checks as a list, then the notes, and reports whether
// all passed.
func report(checks []check, notes ...string) bool {
	ok := true
	fmt.Println()
	for _, c := range checks {
		mark := "yes"
		if !c.ok {
			mark, ok = "**no**", false
		}
		fmt.Printf("- %s: %s\n", c.what, mark)
	}
	for _, n := range notes {
		fmt.Printf("- %s\n", n)
	}
	return ok
}

// roles are the messages' roles, in order.
func roles(msgs []json.RawMessage) []string {
	var out []string
	for _, m := range msgs {
		var r struct{ Role string }
		json.Unmarshal(m, &r)
		out = append(out, r.Role)
	}
	return out
}

// text is a Chat Completions message's content as a string (its text
// parts joined when it is an array).
func text(msg json.RawMessage) string {
	var m struct{ Content json.RawMessage }
	json.Unmarshal(msg, &m)
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct{ Text string }
	json.Unmarshal(m.Content, &parts)
	for _, p := range parts {
		s += p.Text
	}
	return s
}

// opencodeContinue is the message opencode 1.18.33 adds after a summary
// (the same text sim/opencode.go's row sends).
const opencodeContinue = "Continue if you have next steps"

// claudeCompactionRun checks where each claude-code compacts, against
// imgctx simulate's claude-code-like agent (compacting past a share of the
// window, --compact-at, or on a refusal, with the history as sent plus an
// instruction: "shared"). Straight to the scripted upstream, since imgctx
// would answer a refusal itself (by removing images). In each session the
// agent reads three screenshots one a request, the requests that carry one
// billed as the check says. claude-code 2.1.332 does not compact by the
// bill, in print mode or in a terminal (its bundle names a threshold, the
// window less min(the output cap, 20,000) less 13,000, which did not fire
// here even billed past the window); refused as prompt-too-long, it sends
// one summary request with its tools and the history as sent, images
// included, then a request opening with the summary. claude-code 2.0.77
// compacts once the bill passes the window less 45,000 (155,000 of
// Sonnet 4.5's 200,000: 77.5%), with a summary request of the history as
// sent.
func claudeCompactionRun(bin, work, up string, atUpstream *recorded) bool {
	ok, first := true, true
	for _, cc := range agents {
		if cc.name == "claude-code" && !first {
			fmt.Println()
		}
		first = first && cc.name != "claude-code"
		switch {
		case cc.name != "claude-code":
		case cc == newest("claude-code"):
			ok = claudeRefusedRun(cc, bin, work, up, atUpstream) && ok
			fmt.Println()
			ok = claudeClientWindowRun(cc, bin, work, up, atUpstream) && ok
		default:
			ok = claudeThresholdRun(cc, work, up, atUpstream) && ok
		}
	}
	return ok
}

// claudeThreshold is where claude-code 2.0.77 compacts on Sonnet 4.5:
// the window less 45,000, found between bills of 154,900 and 155,100.
const claudeThreshold = 200000 - 45000

// claudeSession runs one print-mode session of cc in a folder of its own
// under name, the requests that carry a screenshot billed at bill, and
// returns the bodies the upstream saw.
func claudeSession(cc agent, work, up string, atUpstream *recorded, name string, bill int) [][]byte {
	dir := claudeFolder(work, name)
	inflated.Store(int64(bill))
	defer inflated.Store(0)
	before := atUpstream.count()
	// Sonnet 4.5: a 200,000-token window (its default model's may be larger).
	cc.run(dir, env(up, filepath.Join(dir, "home")),
		append(cc.ask(readThree, false, up), "--model", "claude-sonnet-4-5")...)
	return atUpstream.since(before)
}

// readThree is the human's prompt of the claude-code compaction sessions.
const readThree = "Read these files one at a time: a-1.png a-2.png a-3.png"

// claudeFolder makes a session's folder with the three screenshots and
// points the scripted upstream at it.
func claudeFolder(work, name string) string {
	dir := filepath.Join(work, "compaction-claude", name)
	os.MkdirAll(dir, 0o755)
	shot, _ := os.ReadFile(filepath.Join(work, "screenshot.png"))
	for _, f := range []string{"a-1.png", "a-2.png", "a-3.png"} {
		os.WriteFile(filepath.Join(dir, f), shot, 0o644)
	}
	setWorkdir(dir)
	return dir
}

// continued opens the request claude-code goes on with after a summary.
func continued(b []byte) bool {
	return bytes.Contains(b, []byte("continued from a previous conversation"))
}

// claudeRefusedRun: the newest claude-code compacts only when refused;
// through imgctx serve, a conversation whose text fills the window is
// refused as it would be without imgctx (no images taken out to make it
// fit), and claude-code compacts.
func claudeRefusedRun(cc agent, bin, work, up string, atUpstream *recorded) bool {
	const billedAt = 190000 // past 90% of 200,000
	billed := claudeSession(cc, work, up, atUpstream, "billed", billedAt)
	terminal, err := claudeTerminal(cc, work, up, atUpstream, "terminal", billedAt,
		readThree, "What did they show?", "And what next?")
	refuseTwo.Store(true)
	refused := claudeSession(cc, work, up, atUpstream, "refused", 0)
	dir := filepath.Join(work, "compaction-claude", "through")
	os.MkdirAll(dir, 0o755)
	cfg := filepath.Join(dir, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: local, format: anthropic, base_url: %q}\n", up)), 0o644)
	serve, gw := start(bin, filepath.Join(dir, "data"), "--config", cfg)
	padded.Store(billedAt)
	through := claudeSession(cc, work, gw.String(), atUpstream, "through", 0)
	padded.Store(0)
	serve.Process.Kill()
	refuseTwo.Store(false)
	throughSum := slices.IndexFunc(through, summaryRequest)
	replayed := slices.ContainsFunc(through, func(b []byte) bool { return bytes.Contains(b, []byte("[image removed")) })

	sum := slices.IndexFunc(refused, summaryRequest)
	var sumImages, sumTools int
	if sum >= 0 {
		var req struct{ Tools []json.RawMessage }
		json.Unmarshal(refused[sum], &req)
		sumImages, sumTools = len(imageData.FindAll(refused[sum], -1)), len(req.Tools)
	}
	after := -1
	if sum >= 0 {
		after = slices.IndexFunc(refused[sum:], continued)
	}
	compacts := func(bodies [][]byte) bool {
		return slices.ContainsFunc(bodies, summaryRequest) || slices.ContainsFunc(bodies, continued)
	}
	var notes []string
	if err != nil {
		notes = append(notes, "the terminal session: "+err.Error())
	}
	fmt.Printf("Compaction of %s (%s, claude-sonnet-4-5), straight to the scripted upstream: a session reads three screenshots one a request.\n\n", cc, cc.wire)
	return report([]check{
		{fmt.Sprintf("billed %d tokens (past 90%% of the window), in print mode it reads all three and compacts not (%d requests)", billedAt, len(billed)),
			len(billed) >= 4 && !compacts(billed)},
		{fmt.Sprintf("billed so in a terminal, over three prompts, it compacts not (%d requests)", len(terminal)),
			err == nil && len(terminal) >= 6 && !compacts(terminal)},
		{fmt.Sprintf("refused as prompt-too-long, it sends one summary request: its %d tools, the history before the refused step as sent, with %d image(s), and an instruction", sumTools, sumImages),
			sum > 0 && sumTools > 0 && sumImages > 0 && len(slices.DeleteFunc(slices.Clone(refused), func(b []byte) bool { return !summaryRequest(b) })) == 1},
		{"then a request opening with the summary", after > 0},
		{fmt.Sprintf("through imgctx serve, billed %d and refused so, imgctx takes no image out to make it fit, and claude-code compacts and goes on from the summary (%d requests)", billedAt, len(through)),
			!replayed && throughSum > 0 && slices.ContainsFunc(through[throughSum:], continued)},
	}, notes...)
}

// claudeThresholdRun: claude-code 2.0.77 compacts past claudeThreshold.
func claudeThresholdRun(cc agent, work, up string, atUpstream *recorded) bool {
	under := claudeSession(cc, work, up, atUpstream, "under", claudeThreshold-1000)
	past := claudeSession(cc, work, up, atUpstream, "past", claudeThreshold+1000)
	sums := slices.DeleteFunc(slices.Clone(past), func(b []byte) bool { return !summaryRequest(b) })
	sumImages := 0
	if len(sums) == 1 {
		sumImages = len(imageData.FindAll(sums[0], -1))
	}
	sum := slices.IndexFunc(past, summaryRequest)
	fmt.Printf("Compaction of %s (%s, claude-sonnet-4-5), straight to the scripted upstream: a session reads three screenshots one a request.\n\n", cc, cc.wire)
	return report([]check{
		{fmt.Sprintf("billed %d tokens, it reads all three and compacts not (%d requests)", claudeThreshold-1000, len(under)),
			len(under) >= 4 && !slices.ContainsFunc(under, summaryRequest) && !slices.ContainsFunc(under, continued)},
		{fmt.Sprintf("billed %d (past the window less 45,000), it sends one summary request: the history as sent, with %d image(s), and an instruction", claudeThreshold+1000, sumImages),
			len(sums) == 1 && sumImages > 0},
		{"then a request opening with the summary", sum >= 0 && slices.ContainsFunc(past[sum:], continued)},
	})
}

// claudeTerminal runs cc in a terminal (script(1) lends it one) as a person
// would, the requests that carry a screenshot billed at bill: it types each
// prompt once the agent has gone quiet, and returns the bodies the upstream
// saw.
func claudeTerminal(cc agent, work, up string, atUpstream *recorded, name string, bill int, prompts ...string) ([][]byte, error) {
	if _, err := exec.LookPath("script"); err != nil {
		return nil, errors.New("script(1), from util-linux, is missing")
	}
	dir := claudeFolder(work, name)
	home := filepath.Join(dir, "home")
	os.MkdirAll(home, 0o755)
	// Onboarding, the key and the folder's trust answered beforehand.
	cfg, _ := json.Marshal(map[string]any{
		"hasCompletedOnboarding": true, "theme": "dark",
		"customApiKeyResponses": map[string][]string{"approved": {"sk-ant-agentcheck"}, "rejected": {}},
		"projects":              map[string]any{dir: map[string]bool{"hasTrustDialogAccepted": true}},
	})
	os.WriteFile(filepath.Join(home, ".claude.json"), cfg, 0o644)
	inflated.Store(int64(bill))
	defer inflated.Store(0)
	screen := filepath.Join(dir, "typescript")
	line := filepath.Join(cc.prefix(), "node_modules", ".bin", cc.bin) + " --model claude-sonnet-4-5"
	cmd := exec.Command("script", "-qfec", line, screen)
	cmd.Dir, cmd.Env = dir, append(env(up, home), "TERM=xterm-256color")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	in, _ := cmd.StdinPipe()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	defer func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}()
	if !waitFor(30*time.Second, func() bool { b, _ := os.ReadFile(screen); return bytes.Contains(b, []byte("❯")) }) {
		return nil, errors.New("no prompt on the screen within 30 seconds")
	}
	time.Sleep(2 * time.Second)
	before := atUpstream.count()
	for _, p := range prompts {
		n := atUpstream.count()
		in.Write([]byte(p))
		time.Sleep(time.Second) // typed, then Enter: not a paste
		in.Write([]byte("\r"))
		// Answered: a request came, then none for three seconds.
		last, at := n, time.Now()
		if !waitFor(time.Minute, func() bool {
			if c := atUpstream.count(); c != last {
				last, at = c, time.Now()
			}
			return last > n && time.Since(at) > 3*time.Second
		}) {
			return atUpstream.since(before), fmt.Errorf("no answer to %q within a minute", p)
		}
	}
	return atUpstream.since(before), nil
}

// waitFor polls done four times a second until it holds or d has passed.
func waitFor(d time.Duration, done func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if done() {
			return true
		}
	}
	return false
}

// claudeWindow is the Messages upstream's window in claudeClientWindowRun:
// Sonnet 4.5's.
const claudeWindow = 200000

// askAbout is the second prompt of claudeClientWindowRun: long enough
// that the request carrying it outgrows the one before by a margin
// imgctx's estimate of what was appended cannot miss.
var askAbout = "What did they show? Answer after reading these notes. " + strings.Repeat("The notes repeat a line of plain words to make the prompt long. ", 60)

// claudeClientWindowRun: claude-code 2.1.332 reads three screenshots,
// then is asked about them, the second prompt's first request padded past
// the window with all three but within it without them. Straight to an
// upstream that refuses past the window, it is refused there and
// compacts. Through imgctx serve with a budget that takes the screenshots
// out at the second prompt: without proxy.client_window the request fits
// and claude-code does not compact there; with it, imgctx refuses the
// request as the provider would have, and claude-code sends what it sent
// straight, request for request.
func claudeClientWindowRun(cc agent, bin, work, up string, atUpstream *recorded) bool {
	session := func(front, name string, pad int) [][]byte {
		dir := claudeFolder(work, name)
		home := filepath.Join(dir, "home")
		var sent recorded
		u, _ := url.Parse(front)
		via := recording(&sent, u, u)
		padded.Store(int64(pad))
		defer padded.Store(0)
		cc.run(dir, env(via, home), append(cc.ask(readThree, false, via), "--model", "claude-sonnet-4-5")...)
		cc.run(dir, env(via, home), append(cc.ask(askAbout, true, via), "--model", "claude-sonnet-4-5")...)
		return sent.since(0)
	}
	asked := func(b []byte) bool {
		return bytes.Contains(b, []byte("The notes repeat")) && !summaryRequest(b) && !continued(b)
	}
	// The padding: half way between the bills of the request before the
	// second prompt and of the one carrying it.
	calibrate := session(up, "window-calibrate", 0)
	i := slices.IndexFunc(calibrate, asked)
	if i < 1 {
		fmt.Printf("The client's window, %s: the calibrating session sent no second prompt (%d requests).\n\n", cc, len(calibrate))
		return report([]check{{"a calibrating session of two prompts", false}})
	}
	before, carrying := billed(calibrate[i-1], imageData, shotTokens), billed(calibrate[i], imageData, shotTokens)
	pad := claudeWindow - (before+carrying)/2

	window.Store(claudeWindow)
	defer window.Store(0)
	straight := session(up, "window-straight", pad)
	through := func(name string, on bool) ([][]byte, [][]byte) {
		dir := filepath.Join(work, "compaction-claude", name+"-imgctx")
		os.MkdirAll(dir, 0o755)
		cfg := filepath.Join(dir, "imgctx.yaml")
		os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: local, format: anthropic, base_url: %q, context_window: %d}\n"+
			"keep: {hold: false, budget_fraction: 0.005}\nproxy: {client_window: %t}\n", up, claudeWindow, on)), 0o644)
		serve, gw := start(bin, filepath.Join(dir, "data"), "--config", cfg)
		defer serve.Process.Kill()
		n := atUpstream.count()
		sent := session(gw.String(), name, pad)
		return sent, atUpstream.since(n)
	}
	off, offUp := through("window-off", false)
	on, onUp := through("window-on", true)

	kinds := func(bodies [][]byte) string { // what claude-code sent, request by request
		var k []string
		for _, b := range bodies {
			switch {
			case summaryRequest(b):
				k = append(k, "summary")
			case continued(b):
				k = append(k, "continued")
			case asked(b):
				k = append(k, "asked")
			default:
				k = append(k, "read")
			}
		}
		return strings.Join(k, " ")
	}
	removed := func(bodies [][]byte) bool {
		return slices.ContainsFunc(bodies, func(b []byte) bool { return bytes.Contains(b, []byte("[image removed")) })
	}
	reachedAsked := func(bodies [][]byte) int {
		return len(slices.DeleteFunc(slices.Clone(bodies), func(b []byte) bool { return !asked(b) }))
	}
	fmt.Printf("The client's window: %s (claude-sonnet-4-5) reads three screenshots, then is asked about them; the upstream refuses past %d tokens, every request padded by %d (the second prompt's first request %d over the window with the screenshots, %d under without them).\n\n",
		cc, claudeWindow, pad, carrying+pad-claudeWindow, claudeWindow-(carrying+pad-3*shotTokens))
	fmt.Printf("- straight: %s\n- through imgctx, proxy.client_window off: %s\n- through imgctx, proxy.client_window on: %s\n\n", kinds(straight), kinds(off), kinds(on))
	return report([]check{
		{"straight, the second prompt's request is refused as too long and claude-code compacts",
			slices.ContainsFunc(straight, summaryRequest)},
		{fmt.Sprintf("through imgctx without proxy.client_window, the screenshots leave at the second prompt, the request fits (%d at the upstream carry it), and claude-code compacts not", reachedAsked(offUp)),
			removed(offUp) && reachedAsked(offUp) > 0 && !slices.ContainsFunc(off, summaryRequest)},
		{"through imgctx with proxy.client_window, claude-code sends what it sent straight, request for request",
			len(on) > 0 && kinds(on) == kinds(straight)},
		{fmt.Sprintf("and the refused request never reaches the upstream (%d at the upstream carry the second prompt)", reachedAsked(onUp)),
			reachedAsked(onUp) == 0},
	})
}
