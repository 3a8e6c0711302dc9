package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// recallRun is the recall check: claude-code and qwen-code, each given
// imgctx's MCP server with its own `mcp add`, and opencode, given it in
// its config, through an imgctx serve
// whose budget keeps no screenshot across turns (keep.hold off) and whose
// markers carry recall handles. Each first session reads screenshot.png;
// resumed, the screenshot is a marker with a handle, the scripted upstream
// calls the recall tool with it, the agent runs the tool against /mcp, and
// its next request must carry the screenshot back, byte for byte, after
// the call.
func recallRun(bin, work string, env []string, up string, atUpstream *recorded) bool {
	dir := filepath.Join(work, "recall")
	os.MkdirAll(dir, 0o755)
	cfg := filepath.Join(dir, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: claude, format: anthropic, base_url: %q, models: [\"claude-*\"]}\n  - {name: local, format: openai, base_url: %q}\n"+
		"keep: {hold: false, budget_fraction: 0.001}\nproxy: {recall: true}\n", up, up)), 0o644)
	serve, gw := start(bin, filepath.Join(dir, "data"), "--config", cfg)
	defer serve.Process.Kill()
	// The home must be there: qwen-code fails on one that is not, where
	// claude-code makes it (a run of qwen-code alone found this).
	os.MkdirAll(filepath.Join(dir, "home"), 0o755)
	env = append(slices.Clone(env), "ANTHROPIC_BASE_URL="+gw.String(), "OPENAI_BASE_URL="+gw.String()+"/v1", "HOME="+filepath.Join(dir, "home"),
		"OPENCODE_CONFIG_CONTENT="+opencodeConfig(gw.String(), gw.String()+"/mcp"))
	setWorkdir(work) // where screenshot.png is
	run := func(a agent, args ...string) string {
		return strings.TrimSpace(lastLine(a.run(work, env, args...)))
	}
	oc := newest("opencode")
	fmt.Println("| agent with imgctx's MCP server | mcp add | first session | resumed: the marker's handle | the screenshot back after the call, byte for byte | answer |")
	fmt.Println("|---|---|---|---|---|---|")
	ok := true
	for _, a := range []struct {
		agent
		add, first []string
		second     []string
	}{
		{newest("claude-code"), []string{"mcp", "add", "--transport", "http", "imgctx", gw.String() + "/mcp"},
			[]string{"-p", "Describe screenshot.png", "--output-format", "text"},
			[]string{"-c", "-p", "What did the screenshot show? Look again if you need to.", "--output-format", "text", "--allowedTools", "mcp__imgctx"}},
		{newest("qwen-code"), []string{"mcp", "add", "--transport", "http", "imgctx", gw.String() + "/mcp"},
			[]string{"-p", "Describe screenshot.png", "--yolo"},
			[]string{"-c", "-p", "What did the screenshot show? Look again if you need to.", "--yolo"}},
		{oc, nil, oc.ask("Describe screenshot.png", false, ""), oc.ask("What did the screenshot show? Look again if you need to.", true, "")},
	} {
		if !slices.Contains(agents, a.agent) {
			continue
		}
		added := "in its config"
		if a.add != nil {
			added = run(a.agent, a.add...)
		}
		firstAt := atUpstream.count()
		first := run(a.agent, a.first...)
		upBefore := atUpstream.count()
		var sent [][]byte // the screenshot as the agent sent it (qwen-code re-encodes it as JPEG)
		for _, b := range atUpstream.since(firstAt)[:upBefore-firstAt] {
			sent = append(sent, base64Image.FindAll(b, -1)...)
		}
		second := run(a.agent, a.second...)
		marker, back := "", false
		for _, b := range atUpstream.since(upBefore) {
			if m := handleIn.FindSubmatch(b); m != nil && marker == "" {
				marker = string(m[1])
			}
			back = back || recalledBack(b, sent)
		}
		ok = ok && marker != "" && back && strings.Contains(second, "scripted upstream")
		fmt.Printf("| %s | %q | %q | %q | %v | %q |\n", a.agent, added, first, marker, back, second)
	}
	return ok
}

// recalledBack: the body answers a recall call, and after it carries one
// of the images the agent sent before, byte for byte (in the tool result,
// or in the user message an OpenAI-wire agent relays a tool's image in).
func recalledBack(body []byte, sent [][]byte) bool {
	i := bytes.Index(body, []byte("_recall_"))
	if i < 0 {
		return false
	}
	for _, img := range sent {
		if bytes.Contains(body[i:], img) {
			return true
		}
	}
	return false
}

// base64Image finds an image's data in a request body, either wire's.
var base64Image = regexp.MustCompile(`("data":"|;base64,)[A-Za-z0-9+/=]{1000,}"`)
