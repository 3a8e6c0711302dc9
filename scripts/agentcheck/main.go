// Command agentcheck runs real coding-agent CLIs through imgctx serve on
// loopback, each against a scripted upstream, and checks what they send.
// It installs the agents from the npm registry — the newest version of
// each and the last of its previous minor — into a cache folder the first
// time (npm must be on the PATH):
//
//	go run ./scripts/agentcheck
//
// Five checks, each a table or a list:
//
//   - Byte for byte: claude-code asks to read screenshot.png (the scripted
//     upstream answers with a Read tool call, and bills the image as Claude
//     would), so its second request carries the image in a tool_result;
//     then its session is resumed (-c) for a second human turn that reads
//     it again, which must stay the same conversation in imgctx's store
//     (the table's column of conversations each run added; a side
//     request with an opening of its own, like qwen-code's memory subagent,
//     is one of its own; the last column, the session headers it sent);
//     qwen-code (OpenAI Chat) the same with read_file, opencode (an
//     OpenAI-compatible provider of its config) with read;
//     codex (OpenAI Responses) describes the screenshot attached to its
//     prompt; gemini-cli (Gemini) the one it reads by @screenshot.png,
//     through an imgctx serve started with flags only. Between the agent
//     and imgctx sits a recording proxy; the upstream records what it gets;
//     every request must reach it unchanged (nothing is removed here).
//   - The budget (budgetRun): every agent reads four screenshots, one a
//     request, with its own read tool, then resumes its session and reads
//     four more, through an imgctx serve whose budget holds about two; the
//     screenshots must leave in one batch at the second turn's start,
//     whichever way the agent relays a tool's image.
//   - Recall (recallRun): claude-code with imgctx's MCP server recalls a
//     screenshot imgctx removed, by the handle its marker names.
//   - Compaction (compactionRun): opencode, told by the scripted upstream
//     that its prompt passed its compaction point, must compact as
//     imgctx simulate's opencode row does (sim/opencode.go).
//   - claude-code's compaction (claudeCompactionRun), straight to the
//     scripted upstream: 2.1.332, billed past 90% of its window, does not
//     compact, in print mode or in a terminal (script(1)); refused as
//     prompt-too-long it summarises the history as sent, with its tools
//     and images, and goes on from the summary; through imgctx serve, its
//     conversation's text filling the window, imgctx leaves the refusal
//     to it and it compacts the same way. The client's window
//     (claudeClientWindowRun): the second prompt's request past the window
//     with its screenshots, within it without them, refused straight;
//     through an imgctx whose budget takes them out, with
//     proxy.client_window claude-code sends what it sent straight, request
//     for request, and without it does not compact there. 2.0.77 compacts
//     once the bill passes the window less 45,000.
//
// AGENTCHECK_ONLY=qwen runs the agents whose name and version hold it;
// AGENTCHECK_RUNS=budget,claude the checks named (identity, budget,
// recall, compaction, claude); AGENTCHECK_DUMP=DIR keeps every upstream
// body and the stores.
package main

import (
	"bytes"
	"cmp"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	_ "modernc.org/sqlite"
)

// agent is one version of an agent CLI from npm.
type agent struct{ name, pkg, version, bin, wire string }

// everyAgent is the agents run, newest version first; agents are those
// picked (AGENTCHECK_ONLY).
var everyAgent = []agent{
	{"claude-code", "@anthropic-ai/claude-code", "2.1.332", "claude", "Anthropic Messages"},
	{"claude-code", "@anthropic-ai/claude-code", "2.0.77", "claude", "Anthropic Messages"},
	{"qwen-code", "@qwen-code/qwen-code", "0.24.4", "qwen", "OpenAI Chat Completions"},
	{"qwen-code", "@qwen-code/qwen-code", "0.23.4", "qwen", "OpenAI Chat Completions"},
	{"codex", "@openai/codex", "0.171.0", "codex", "OpenAI Responses"},
	{"codex", "@openai/codex", "0.169.1", "codex", "OpenAI Responses"},
	{"gemini-cli", "@google/gemini-cli", "0.61.0", "gemini", "Gemini generateContent"},
	{"gemini-cli", "@google/gemini-cli", "0.60.0", "gemini", "Gemini generateContent"},
	// opencode on both wires it is mostly used on; 1.17.20's native binary
	// is not on the registry.
	{"opencode", "opencode-ai", "1.18.33", "opencode", "OpenAI Chat Completions"},
	{"opencode", "opencode-ai", "1.18.33", "opencode", "Anthropic Messages"},
	{"opencode", "opencode-ai", "1.17.19", "opencode", "OpenAI Chat Completions"},
}

var agents = everyAgent

// newest is the first listed version of the agent.
func newest(name string) agent {
	for _, a := range everyAgent {
		if a.name == name {
			return a
		}
	}
	panic(name)
}

// String names the agent's version, and its wire when it runs on two.
func (a agent) String() string {
	for _, b := range everyAgent {
		if b.name == a.name && b.version == a.version && b.wire != a.wire {
			return a.name + " " + a.version + " on " + a.wire
		}
	}
	return a.name + " " + a.version
}

// folder is the agent's own folder name: each version and wire in one of
// its own, so that a resume finds its own session.
func (a agent) folder() string {
	return a.bin + "-" + a.version + "-" + strings.ToLower(strings.Fields(a.wire)[0])
}

// cache is where the agents are installed, one npm prefix a version.
var cache = filepath.Join(os.TempDir(), "imgctx-agentcheck")

func (a agent) prefix() string {
	return filepath.Join(cache, strings.ReplaceAll(strings.TrimPrefix(a.pkg, "@"), "/", "-")+"-"+a.version)
}

func (a agent) install() {
	var installed struct{ Version string }
	if b, err := os.ReadFile(filepath.Join(a.prefix(), "node_modules", a.pkg, "package.json")); err == nil && json.Unmarshal(b, &installed) == nil && installed.Version == a.version {
		return
	}
	fmt.Fprintf(os.Stderr, "installing %s@%s…\n", a.pkg, a.version)
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", a.prefix(), a.pkg+"@"+a.version)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		log.Fatalf("npm install %s@%s: %v", a.pkg, a.version, err)
	}
	// claude-code's package ships its native binary through an optional
	// dependency that its install script links into place.
	if script := filepath.Join(a.prefix(), "node_modules", a.pkg, "install.cjs"); a.bin == "claude" {
		if _, err := os.Stat(script); err == nil {
			exec.Command("node", script).Run()
		}
	}
}

// run runs the agent in dir and returns what it printed; it is stopped
// after three minutes.
func (a agent) run(dir string, env []string, args ...string) string {
	cmd := exec.Command(filepath.Join(a.prefix(), "node_modules", ".bin", a.bin), args...)
	cmd.Dir, cmd.Env = dir, env
	// gemini-cli runs itself again as a child: the whole group is stopped.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return err.Error()
	}
	timer := time.AfterFunc(3*time.Minute, func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	defer timer.Stop()
	cmd.Wait()
	return out.String()
}

// ask is the command line that gives the agent a prompt in print mode,
// resuming its last session in that folder when resume is set; codex
// reaches the upstream through a provider of its own named in flags.
func (a agent) ask(prompt string, resume bool, front string) []string {
	switch a.bin {
	case "claude":
		if resume {
			return []string{"-c", "-p", prompt, "--output-format", "text"}
		}
		return []string{"-p", prompt, "--output-format", "text"}
	case "qwen":
		if resume {
			return []string{"-c", "-p", prompt, "--yolo"}
		}
		return []string{"-p", prompt, "--yolo"}
	case "opencode":
		model := "imgctx/qwen3-vl-plus" // opencodeConfig's providers
		if a.wire == "Anthropic Messages" {
			model = "anthropic/claude-sonnet-4-5"
		}
		args := []string{"run", "--auto", "-m", model}
		if resume {
			args = append(args, "-c")
		}
		return append(args, prompt)
	case "codex":
		args := []string{"exec"}
		if resume {
			args = append(args, "resume", "--last")
		}
		return append(args, "--skip-git-repo-check", "-c", `model="gpt-5.1-codex"`, "-c", `model_provider="imgctx"`,
			"-c", `model_providers.imgctx={name="imgctx",base_url="`+front+`/v1",wire_api="responses",env_key="OPENAI_API_KEY"}`, prompt)
	default:
		if resume {
			return []string{"--resume", "latest", "-p", prompt}
		}
		return []string{"-p", prompt}
	}
}

// env is the agents' environment: each reaches front, with a home of its
// own (gemini-cli told which way to authenticate, as its settings say).
func env(front, home string) []string {
	os.MkdirAll(filepath.Join(home, ".gemini"), 0o755)
	os.WriteFile(filepath.Join(home, ".gemini", "settings.json"),
		[]byte(`{"security":{"auth":{"selectedType":"gemini-api-key"}},"selectedAuthType":"gemini-api-key"}`), 0o644)
	return append(os.Environ(), "HOME="+home, "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "ANTHROPIC_BASE_URL="+front, "ANTHROPIC_API_KEY=sk-ant-agentcheck",
		"OPENAI_BASE_URL="+front+"/v1", "OPENAI_API_KEY=sk-agentcheck", "OPENAI_MODEL=qwen3-vl-plus",
		"GEMINI_API_KEY=agentcheck", "GOOGLE_GEMINI_BASE_URL="+front, "GEMINI_CLI_TRUST_WORKSPACE=true",
		"OPENCODE_CONFIG_CONTENT="+opencodeConfig(front, ""), "OPENCODE_DISABLE_MODELS_FETCH=1", "OPENCODE_DISABLE_AUTOUPDATE=1",
		"OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_DEFAULT_PLUGINS=1", "OPENCODE_DISABLE_CLAUDE_CODE=1", "OPENCODE_DISABLE_SHARE=1")
}

// recorded holds request bodies in arrival order, by who saw them.
type recorded struct {
	mu      sync.Mutex
	bodies  [][]byte
	paths   []string
	headers []http.Header
}

// add records a request and returns its place.
func (r *recorded) add(req *http.Request, b []byte) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bodies, r.paths, r.headers = append(r.bodies, b), append(r.paths, req.URL.Path), append(r.headers, req.Header.Clone())
	return len(r.bodies) - 1
}

func (r *recorded) headersSince(i int) []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.headers[i:])
}

// sessionHeaders names the headers of hs that name a session or a
// conversation, each with how many values it took: what imgctx can tell
// an agent's conversations apart by (engine.ConversationKey).
func sessionHeaders(hs []http.Header) string {
	values := map[string]map[string]bool{}
	for _, h := range hs {
		for k, v := range h {
			if l := strings.ToLower(k); strings.Contains(l, "session") || strings.Contains(l, "conversation") {
				if values[k] == nil {
					values[k] = map[string]bool{}
				}
				values[k][v[0]] = true
			}
		}
	}
	var out []string
	for k, v := range values {
		out = append(out, fmt.Sprintf("%s (%d)", k, len(v)))
	}
	slices.Sort(out)
	return cmp.Or(strings.Join(out, ", "), "none")
}

func (r *recorded) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.bodies)
}

func (r *recorded) since(i int) [][]byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.bodies[i:])
}

func listen(h http.Handler) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go http.Serve(ln, h)
	return "http://" + ln.Addr().String()
}

// recording is a proxy in front of imgctx that records what the agent
// sent; Gemini's paths go to the gemini gateway. Each request goes on
// with X-Request-Id "agentcheck-" and its place, the id its line in
// imgctx's request log takes.
func recording(to *recorded, gw, gemini *url.URL) string {
	rp, geminiRP := httputil.NewSingleHostReverseProxy(gw), httputil.NewSingleHostReverseProxy(gemini)
	return listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Header.Set("X-Request-Id", fmt.Sprint("agentcheck-", to.add(r, b)))
		r.Body = io.NopCloser(bytes.NewReader(b))
		if strings.HasPrefix(r.URL.Path, "/v1beta/") {
			geminiRP.ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))
}

// conversationOf reads the conversation of the request recorded at place
// i from the request log of the store in dir; "" if it has no line.
func conversationOf(dir string, i int) string {
	db, err := sql.Open("sqlite", filepath.Join(dir, "imgctx.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	var key string
	db.QueryRow(`SELECT conversation FROM requests WHERE id = ?`, fmt.Sprint("agentcheck-", i)).Scan(&key)
	return key
}

// conversations counts the proxied conversations in the data folders'
// stores.
func conversations(dirs ...string) func() int {
	var dbs []*sql.DB
	for _, dir := range dirs {
		db, err := sql.Open("sqlite", filepath.Join(dir, "imgctx.db"))
		if err != nil {
			log.Fatal(err)
		}
		dbs = append(dbs, db)
	}
	return func() int {
		total := 0
		for _, db := range dbs {
			var n int
			db.QueryRow(`SELECT count(*) FROM proxied`).Scan(&n)
			total += n
		}
		return total
	}
}

func main() {
	// AGENTCHECK_ONLY=qwen (any part of "qwen-code 0.24.4") runs those alone.
	if only := os.Getenv("AGENTCHECK_ONLY"); only != "" {
		agents = slices.DeleteFunc(slices.Clone(everyAgent), func(a agent) bool { return !strings.Contains(a.String(), only) })
	}
	for _, a := range agents {
		a.install()
	}
	var atUpstream, atClient recorded
	up := listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		atUpstream.add(r, b)
		// AGENTCHECK_DUMP=DIR writes every upstream body there (and keeps
		// the stores).
		if d := os.Getenv("AGENTCHECK_DUMP"); d != "" {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("%03d.json", atUpstream.count())), b, 0o644)
		}
		scripted(w, r, b)
	}))
	work, _ := os.MkdirTemp("", "agentcheck")
	if os.Getenv("AGENTCHECK_DUMP") == "" {
		defer os.RemoveAll(work)
	} else {
		fmt.Fprintln(os.Stderr, "agentcheck: the stores stay in", work)
	}
	shot, err := os.ReadFile("testdata/screenshot.png")
	if err != nil {
		log.Fatal("run from the repository root: ", err)
	}
	os.WriteFile(filepath.Join(work, "screenshot.png"), shot, 0o644)
	bin := filepath.Join(work, "imgctx")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/imgctx").CombinedOutput(); err != nil {
		log.Fatalf("build: %v\n%s", err, out)
	}
	// AGENTCHECK_RUNS=budget,claude (any of identity, budget, recall,
	// compaction, claude) runs those alone.
	runs := []struct {
		name string
		run  func() bool
	}{
		{"identity", func() bool { return identityRun(bin, work, shot, up, &atUpstream, &atClient) }},
		{"budget", func() bool { return budgetRun(bin, work, shot, up, &atUpstream, &atClient) }},
		{"recall", func() bool { return recallRun(bin, work, env(up, filepath.Join(work, "recall-home")), up, &atUpstream) }},
		{"compaction", func() bool { return compactionRun(bin, work, up, &atUpstream) }},
		{"claude", func() bool { return claudeCompactionRun(bin, work, up, &atUpstream) }},
	}
	only := strings.Split(os.Getenv("AGENTCHECK_RUNS"), ",")
	failed := false
	for i, r := range runs {
		if only[0] != "" && !slices.Contains(only, r.name) {
			continue
		}
		if i > 0 {
			fmt.Println()
		}
		failed = !r.run() || failed
	}
	if failed {
		os.Exit(1)
	}
}

// identityRun is the byte-for-byte check. One imgctx serves claude-code,
// qwen-code and codex from a config file listing two upstreams;
// gemini-cli's runs with flags only, as the README's set-up line says.
func identityRun(bin, work string, shot []byte, up string, atUpstream, atClient *recorded) bool {
	cfg := filepath.Join(work, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: claude, format: anthropic, base_url: %q, models: [\"claude-*\"]}\n  - {name: local, format: openai, base_url: %q}\n", up, up)), 0o644)
	serve, gw := start(bin, filepath.Join(work, "data"), "--config", cfg)
	defer serve.Process.Kill()
	geminiServe, geminiGW := start(bin, filepath.Join(work, "data-gemini"), "--upstream", up, "--upstream-format", "gemini")
	defer geminiServe.Process.Kill()
	front := recording(atClient, gw, geminiGW)
	count := conversations(filepath.Join(work, "data"), filepath.Join(work, "data-gemini"))

	fmt.Println("| agent | answer | requests | byte-identical at the upstream | new conversations in the store (resumed: does it go on in the first run's) | session headers (distinct values) |")
	fmt.Println("|---|---|---|---|---|---|")
	ok := true
	for _, a := range agents {
		dir := filepath.Join(work, "identity", a.folder())
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, "screenshot.png"), shot, 0o644)
		setWorkdir(dir)
		env := env(front, filepath.Join(work, "home", a.folder()))
		type step struct {
			what string
			args []string
		}
		var steps []step
		switch a.bin {
		case "claude", "qwen", "opencode":
			steps = []step{
				{"(" + a.wire + "), reads screenshot.png", a.ask("Describe screenshot.png", false, front)},
				{"resumed, reads it again", a.ask("Look at screenshot.png once more", true, front)}}
			if a.bin == "opencode" {
				// The human's own image: attached to the prompt (-f), in the
				// user message, not read by a tool.
				// -f last: it takes every word after it as a file.
				args := append(a.ask("What does this show?", true, front), "-f", filepath.Join(dir, "screenshot.png"))
				steps = append(steps, step{"resumed, the screenshot attached (-f)", args})
			}
		case "codex":
			args := a.ask("Describe the screenshot", false, front)
			steps = []step{{"(" + a.wire + "), screenshot attached", slices.Insert(args, 1, "-i", filepath.Join(dir, "screenshot.png"))}}
		default:
			steps = []step{{"(" + a.wire + "), screenshot by @", a.ask("Describe @screenshot.png", false, front)}}
		}
		var first map[string]bool // the first step's conversations, from the request log
		for _, s := range steps {
			convs, before, upBefore := count(), atClient.count(), atUpstream.count()
			answer := a.run(dir, env, s.args...)
			bodies, sent := atClient.since(before), atUpstream.since(upBefore)
			same := 0
			for _, b := range bodies {
				// Side requests run beside the main one: matched by
				// content, each upstream body once.
				if i := slices.IndexFunc(sent, func(s []byte) bool { return bytes.Equal(s, b) }); i >= 0 {
					sent = slices.Delete(sent, i, i+1)
					same++
				}
			}
			good := len(bodies) > 0 && same == len(bodies) && strings.Contains(answer, "scripted upstream")
			if strings.Contains(s.what, "attached") {
				// The attachment must have reached the upstream as an image.
				good = good && slices.ContainsFunc(bodies, func(b []byte) bool { return base64Image.Match(b) })
			}
			time.Sleep(1500 * time.Millisecond) // the decisions are written within a second
			// A resumed session goes on in a conversation of its first run
			// (its side requests may open others).
			these := map[string]bool{}
			for i := before; i < before+len(bodies); i++ {
				if c := conversationOf(filepath.Join(work, "data"), i); c != "" {
					these[c] = true
				}
			}
			goesOn := ""
			if first == nil {
				first = these
			} else if strings.HasPrefix(s.what, "resumed") {
				on := slices.ContainsFunc(slices.Collect(maps.Keys(these)), func(c string) bool { return first[c] })
				goesOn = ", a new conversation"
				if on {
					goesOn = ", goes on"
				}
				good = good && on
			}
			ok = ok && good
			fmt.Printf("| %s %s %s | %q | %d | %d of %d | %d%s | %s |\n", a.name, a.version, s.what, strings.TrimSpace(lastLine(answer)), len(bodies), same, len(bodies), count()-convs, goesOn, sessionHeaders(atClient.headersSince(before)))
		}
	}
	seen := map[string]bool{}
	for _, h := range atClient.headers {
		if id := h.Get("X-Claude-Code-Session-Id"); id != "" {
			seen[id] = true
		}
	}
	fmt.Printf("\nclaude-code session ids sent: %d\n", len(seen))
	for _, g := range []*url.URL{gw, geminiGW} {
		resp, err := http.Get(g.String() + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Println()
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "imgctx_images_total") {
				fmt.Println(l)
			}
		}
	}
	return ok
}

// start runs imgctx serve on a loopback port of its own with its data in
// dir, and returns the process and its address.
func start(bin, dir string, args ...string) (*exec.Cmd, *url.URL) {
	serve := exec.Command(bin, append(append([]string{"serve"}, args...), "--addr", "127.0.0.1:0")...)
	serve.Env = append(os.Environ(), "IMGCTX_DATA_DIR="+dir, "IMGCTX_LOG_LEVEL=warn")
	out, _ := serve.StdoutPipe()
	serve.Stderr = os.Stderr
	if err := serve.Start(); err != nil {
		log.Fatal(err)
	}
	line := make([]byte, 256)
	n, _ := out.Read(line)
	m := regexp.MustCompile(`listening on (http://\S+)`).FindSubmatch(line[:n])
	if m == nil {
		serve.Process.Kill()
		log.Fatalf("imgctx %v did not start: %s", args, line[:n])
	}
	gw, _ := url.Parse(string(m[1]))
	return serve, gw
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// opencodeConfig is opencode's configuration: front as an
// OpenAI-compatible provider serving a vision model, and as Anthropic;
// with mcp, imgctx's MCP server at that URL too.
func opencodeConfig(front, mcp string) string { return opencodeConfigWith(front, mcp, "") }

// opencodeConfigWith is opencodeConfig with the vision model's limits (a
// JSON object such as {"context":50000,"output":8000}; "" none).
func opencodeConfigWith(front, mcp, limit string) string {
	servers := ""
	if mcp != "" {
		servers = `,"mcp":{"imgctx":{"type":"remote","url":"` + mcp + `","enabled":true}}`
	}
	if limit != "" {
		limit = `,"limit":` + limit
	}
	return `{"model":"imgctx/qwen3-vl-plus","autoupdate":false` + servers + `,"provider":{"imgctx":{"npm":"@ai-sdk/openai-compatible","name":"imgctx",` +
		`"options":{"baseURL":"` + front + `/v1","apiKey":"sk-agentcheck"},` +
		`"models":{"qwen3-vl-plus":{"name":"qwen3-vl-plus","attachment":true,"tool_call":true,"modalities":{"input":["text","image"],"output":["text"]}` + limit + `}}},` +
		`"anthropic":{"options":{"baseURL":"` + front + `/v1"}}}}`
}
