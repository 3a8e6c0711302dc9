// Command agentcheck runs real coding-agent CLIs through imgctx serve on
// loopback, each against a scripted upstream, and checks that what the
// agent sent reaches the upstream byte for byte (images stored once by the
// way). It installs the agents from the npm registry into a cache folder
// the first time (npm must be on the PATH):
//
//	go run ./scripts/agentcheck
//
// claude-code asks to read testdata/screenshot.png (the scripted upstream
// answers with a Read tool call, and bills the image as Claude would), so
// its second request carries the image in a tool_result; then its session
// is resumed (-c) for a second human turn that reads it again, which must
// stay the same conversation in imgctx's store (the table's last column:
// the conversations each run added; a side request with an opening of its
// own, like qwen-code's memory subagent, is one of its own); qwen-code
// (OpenAI format) says hello; codex (OpenAI
// Responses) describes the screenshot attached to its prompt; gemini-cli
// (Gemini) the one it reads by @screenshot.png. Between the agent
// and imgctx sits a recording proxy; the upstream records what it gets.
// One imgctx process serves both, routed by its upstreams list.
//
// Then the recall check (recallRun): claude-code with imgctx's MCP server
// recalls a screenshot imgctx removed, by the handle its marker names.
package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite"
)

var agents = []struct{ pkg, bin string }{
	{"@anthropic-ai/claude-code@2.1.332", "claude"},
	{"@qwen-code/qwen-code@0.24.4", "qwen"},
	{"@openai/codex@0.171.0", "codex"},
	{"@google/gemini-cli@0.61.0", "gemini"},
}

// recorded holds request bodies in arrival order, by who saw them.
type recorded struct {
	mu      sync.Mutex
	bodies  [][]byte
	paths   []string
	headers []http.Header
}

func (r *recorded) add(req *http.Request, b []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.bodies, r.paths, r.headers = append(r.bodies, b), append(r.paths, req.URL.Path), append(r.headers, req.Header.Clone())
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

func main() {
	cache := filepath.Join(os.TempDir(), "imgctx-agentcheck")
	os.MkdirAll(cache, 0o755)
	for _, a := range agents {
		name, version, _ := strings.Cut(a.pkg[1:], "@")
		var installed struct{ Version string }
		if b, err := os.ReadFile(filepath.Join(cache, "node_modules", "@"+name, "package.json")); err == nil && json.Unmarshal(b, &installed) == nil && installed.Version == version {
			continue
		}
		fmt.Fprintf(os.Stderr, "installing %s…\n", a.pkg)
		cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--prefix", cache, a.pkg)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			log.Fatalf("npm install %s: %v", a.pkg, err)
		}
	}
	// claude-code's package ships its native binary through an optional
	// dependency that its install script links into place.
	exec.Command("node", filepath.Join(cache, "node_modules/@anthropic-ai/claude-code/install.cjs")).Run()

	var atUpstream, atClient recorded
	up := listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		atUpstream.add(r, b)
		if d := os.Getenv("AGENTCHECK_DUMP"); d != "" {
			os.WriteFile(filepath.Join(d, fmt.Sprintf("%03d.json", len(atUpstream.bodies))), b, 0o644)
		}
		scripted(w, r, b)
	}))
	work, _ := os.MkdirTemp("", "agentcheck")
	defer os.RemoveAll(work)
	shot, err := os.ReadFile("testdata/screenshot.png")
	if err != nil {
		log.Fatal("run from the repository root: ", err)
	}
	shotPath = filepath.Join(work, "screenshot.png")
	os.WriteFile(shotPath, shot, 0o644)
	// One imgctx serves claude-code, qwen-code and codex from a config file
	// listing two upstreams; gemini-cli's runs with flags only, as the
	// README's set-up line says.
	cfg := filepath.Join(work, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: claude, format: anthropic, base_url: %q, models: [\"claude-*\"]}\n  - {name: local, format: openai, base_url: %q}\n", up, up)), 0o644)

	bin := filepath.Join(work, "imgctx")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/imgctx").CombinedOutput(); err != nil {
		log.Fatalf("build: %v\n%s", err, out)
	}
	serve, gw := start(bin, filepath.Join(work, "data"), "--config", cfg)
	defer serve.Process.Kill()
	geminiServe, geminiGW := start(bin, filepath.Join(work, "data-gemini"), "--upstream", up, "--upstream-format", "gemini")
	defer geminiServe.Process.Kill()
	rp, geminiRP := httputil.NewSingleHostReverseProxy(gw), httputil.NewSingleHostReverseProxy(geminiGW)
	front := listen(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		atClient.add(r, b)
		r.Body = io.NopCloser(bytes.NewReader(b))
		if strings.HasPrefix(r.URL.Path, "/v1beta/") {
			geminiRP.ServeHTTP(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	}))

	env := append(os.Environ(), "HOME="+filepath.Join(work, "home"), "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "ANTHROPIC_BASE_URL="+front, "ANTHROPIC_API_KEY=sk-ant-agentcheck",
		"OPENAI_BASE_URL="+front+"/v1", "OPENAI_API_KEY=sk-agentcheck", "OPENAI_MODEL=qwen3-vl-plus",
		"GEMINI_API_KEY=agentcheck", "GOOGLE_GEMINI_BASE_URL="+front, "GEMINI_CLI_TRUST_WORKSPACE=true")
	// gemini-cli asks which way to authenticate unless its settings say.
	os.MkdirAll(filepath.Join(work, "home", ".gemini"), 0o755)
	os.WriteFile(filepath.Join(work, "home", ".gemini", "settings.json"),
		[]byte(`{"security":{"auth":{"selectedType":"gemini-api-key"}},"selectedAuthType":"gemini-api-key"}`), 0o644)
	runs := []struct {
		name string
		args []string
	}{
		{"claude-code 2.1.332 (Anthropic Messages), reads screenshot.png", []string{"claude", "-p", "Describe screenshot.png", "--output-format", "text"}},
		{"claude-code 2.1.332, the session resumed (-c), reads it again", []string{"claude", "-c", "-p", "Look at screenshot.png once more", "--output-format", "text"}},
		{"qwen-code 0.24.4 (OpenAI Chat Completions), reads screenshot.png", []string{"qwen", "-p", "Describe screenshot.png", "--yolo"}},
		{"qwen-code 0.24.4, the session resumed (-c), reads it again", []string{"qwen", "-c", "-p", "Look at screenshot.png once more", "--yolo"}},
		{"codex 0.171.0 (OpenAI Responses), screenshot attached", []string{"codex", "exec", "--skip-git-repo-check", "-i", shotPath,
			"-c", `model="gpt-5.1-codex"`, "-c", `model_provider="imgctx"`,
			"-c", `model_providers.imgctx={name="imgctx",base_url="` + front + `/v1",wire_api="responses",env_key="OPENAI_API_KEY"}`,
			"Describe the screenshot"}},
		{"gemini-cli 0.61.0 (Gemini generateContent), screenshot by @", []string{"gemini", "-p", "Describe @screenshot.png"}},
	}
	// The conversations the store has, after each run: one key per agent
	// conversation (a resumed session adds none; side requests with an
	// opening of their own are conversations of their own).
	var dbs []*sql.DB
	for _, dir := range []string{"data", "data-gemini"} {
		db, err := sql.Open("sqlite", filepath.Join(work, dir, "imgctx.db"))
		if err != nil {
			log.Fatal(err)
		}
		defer db.Close()
		dbs = append(dbs, db)
	}
	conversations := func() int {
		total := 0
		for _, db := range dbs {
			var n int
			db.QueryRow(`SELECT count(*) FROM proxied`).Scan(&n)
			total += n
		}
		return total
	}
	fmt.Println("| agent | answer | requests | byte-identical at the upstream | new conversations in the store |")
	fmt.Println("|---|---|---|---|---|")
	failed := false
	for _, run := range runs {
		convs := conversations()
		before := len(atClient.bodies)
		cmd := exec.Command(filepath.Join(cache, "node_modules", ".bin", run.args[0]), run.args[1:]...)
		cmd.Dir, cmd.Env = work, env
		done := make(chan struct{})
		var answer []byte
		go func() { answer, _ = cmd.CombinedOutput(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Minute):
			cmd.Process.Kill()
			<-done
		}
		same, total := 0, len(atClient.bodies)-before
		for i := before; i < len(atClient.bodies); i++ {
			if i < len(atUpstream.bodies) && bytes.Equal(atClient.bodies[i], atUpstream.bodies[i]) {
				same++
			}
		}
		ok := total > 0 && same == total && strings.Contains(string(answer), "scripted upstream")
		failed = failed || !ok
		time.Sleep(1500 * time.Millisecond) // the decisions are written within a second
		fmt.Printf("| %s | %q | %d | %d of %d | %d |\n", run.name, strings.TrimSpace(lastLine(string(answer))), total, same, total, conversations()-convs)
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
	fmt.Println()
	if !recallRun(bin, work, cache, env, up, &atUpstream) {
		failed = true
	}
	if failed {
		serve.Process.Kill() // os.Exit runs no deferred call
		geminiServe.Process.Kill()
		os.Exit(1)
	}
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

// shotPath is the screenshot the scripted upstream asks the agents to read.
var shotPath string

// calls numbers the scripted tool calls: each id once in a session.
var calls atomic.Int64

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// scripted answers like the provider would: a Read tool call for the
// screenshot the first time claude-code asks about it, then text; for
// OpenAI-format agents a streamed text reply.
func scripted(w http.ResponseWriter, r *http.Request, body []byte) {
	if strings.HasSuffix(r.URL.Path, "/chat/completions") {
		w.Header().Set("Content-Type", "text/event-stream")
		if tool, input, id := asksToRecall(body); tool != "" {
			for _, ev := range []string{
				`{"id":"c2","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"` + id + fmt.Sprint(calls.Add(1)) + `","type":"function","function":{"name":` + strconv.Quote(tool) + `,"arguments":` + strconv.Quote(input) + `}}]},"finish_reason":null}]}`,
				`{"id":"c2","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
				`{"id":"c2","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[],"usage":{"prompt_tokens":` + fmt.Sprint(openaiInput(body)) + `,"completion_tokens":20,"total_tokens":` + fmt.Sprint(openaiInput(body)+20) + `}}`,
			} {
				fmt.Fprintf(w, "data: %s\n\n", ev)
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		if asksForTheScreenshot(body) {
			// qwen-code's read_file, which relays the image in a user
			// message after the tool message.
			args, _ := json.Marshal(map[string]string{"file_path": shotPath})
			calls.Add(1)
			for _, ev := range []string{
				`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_` + fmt.Sprint(calls.Load()) + `","type":"function","function":{"name":"read_file","arguments":` + strconv.Quote(string(args)) + `}}]},"finish_reason":null}]}`,
				`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`,
				`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[],"usage":{"prompt_tokens":` + fmt.Sprint(openaiInput(body)) + `,"completion_tokens":20,"total_tokens":` + fmt.Sprint(openaiInput(body)+20) + `}}`,
			} {
				fmt.Fprintf(w, "data: %s\n\n", ev)
			}
			io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		for _, ev := range []string{
			`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello from the scripted upstream."},"finish_reason":null}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}`,
			`{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[],"usage":{"prompt_tokens":` + fmt.Sprint(openaiInput(body)) + `,"completion_tokens":7,"total_tokens":` + fmt.Sprint(openaiInput(body)+7) + `}}`,
		} {
			fmt.Fprintf(w, "data: %s\n\n", ev)
		}
		io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	if strings.Contains(r.URL.Path, ":streamGenerateContent") || strings.Contains(r.URL.Path, ":generateContent") {
		final := `{"candidates":[{"content":{"role":"model","parts":[{"text":"Hello from the scripted upstream."}]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":100,"candidatesTokenCount":7,"totalTokenCount":107},"modelVersion":"gemini-2.5-pro"}`
		if strings.Contains(r.URL.Path, ":streamGenerateContent") {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s\r\n\r\n", final)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, final)
		return
	}
	if strings.Contains(r.URL.Path, ":countTokens") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"totalTokens":42}`)
		return
	}
	if strings.HasSuffix(r.URL.Path, "/responses") {
		w.Header().Set("Content-Type", "text/event-stream")
		item := `{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hello from the scripted upstream.","annotations":[]}]}`
		for _, ev := range []string{
			`{"type":"response.created","sequence_number":0,"response":{"id":"resp_1","object":"response","created_at":1,"status":"in_progress","model":"gpt-5.1-codex","output":[]}}`,
			`{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}`,
			`{"type":"response.output_text.delta","sequence_number":2,"item_id":"msg_1","output_index":0,"content_index":0,"delta":"Hello from the scripted upstream."}`,
			`{"type":"response.output_item.done","sequence_number":3,"output_index":0,"item":` + item + `}`,
			`{"type":"response.completed","sequence_number":4,"response":{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-5.1-codex","output":[` + item + `],"usage":{"input_tokens":1500,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":1507}}}`,
		} {
			var t struct{ Type string }
			json.Unmarshal([]byte(ev), &t)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", t.Type, ev)
		}
		return
	}
	if strings.HasSuffix(r.URL.Path, "/count_tokens") {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"input_tokens":42}`)
		return
	}
	if tool, input, id := asksToRecall(body); tool != "" {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"model":` + strconv.Quote(requestModel(body)) + `,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` + fmt.Sprint(claudeInput(body)) + `,"output_tokens":1}}}`,
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"` + id + fmt.Sprint(calls.Add(1)) + `","name":` + strconv.Quote(tool) + `,"input":{}}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":` + strconv.Quote(input) + `}}`,
			`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`,
		} {
			io.WriteString(w, ev+"\n\n")
		}
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	start := `event: message_start` + "\n" + `data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":` + strconv.Quote(requestModel(body)) + `,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` + fmt.Sprint(claudeInput(body)) + `,"output_tokens":1}}}`
	events := []string{start,
		`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello from the scripted upstream."}}`,
		`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
		`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}`,
		`event: message_stop` + "\n" + `data: {"type":"message_stop"}`}
	if asksForTheScreenshot(body) {
		events = []string{start,
			`event: content_block_start` + "\n" + `data: {"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"toolu_01","name":"Read","input":{}}}`,
			`event: content_block_delta` + "\n" + `data: {"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"file_path\": \"` + shotPath + `\"}"}}`,
			`event: content_block_stop` + "\n" + `data: {"type":"content_block_stop","index":0}`,
			`event: message_delta` + "\n" + `data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}`,
			`event: message_stop` + "\n" + `data: {"type":"message_stop"}`}
	}
	for _, ev := range events {
		io.WriteString(w, ev+"\n\n")
	}
}

// requestModel is the model a request names: the provider answers with
// it, and claude-code resumes a session with the model of its last answer.
func requestModel(body []byte) string {
	var req struct{ Model string }
	json.Unmarshal(body, &req)
	return req.Model
}

// asksForTheScreenshot: the last message is the human's and names the
// screenshot (a tool result answers the Read).
func asksForTheScreenshot(body []byte) bool {
	var req struct {
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if json.Unmarshal(body, &req) != nil {
		return false
	}
	// claude-code 2.1.332 puts its environment in a system message after
	// the human's: the last message that is not the system's.
	for len(req.Messages) > 0 && req.Messages[len(req.Messages)-1].Role == "system" {
		req.Messages = req.Messages[:len(req.Messages)-1]
	}
	if len(req.Messages) == 0 {
		return false
	}
	last := req.Messages[len(req.Messages)-1]
	return last.Role == "user" && bytes.Contains(last.Content, []byte("screenshot.png")) && !bytes.Contains(last.Content, []byte(`"tool_result"`)) &&
		!bytes.Contains(last.Content, []byte("image_url"))
}

// handleIn is a marker's recall handle as the JSON of a request carries it.
var handleIn = regexp.MustCompile(`imgctx_recall\(\\"(i[a-z2-7]{11})\\"\)`)

// asksToRecall is what a model does on reading a marker with a recall
// handle, once per session: call the recall tool (under the name the agent
// gives MCP tools) with the handle, after loading its schema with
// claude-code's ToolSearch when the agent lists it as deferred. It returns
// the tool to call, its input and the id prefix of the call; "" when the
// request is not the place.
func asksToRecall(body []byte) (tool, input, id string) {
	var req struct {
		Tools []struct {
			Name     string `json:"name"`
			Function struct {
				Name string `json:"name"`
			} `json:"function"`
		} `json:"tools"`
	}
	m := handleIn.FindSubmatch(body)
	if json.Unmarshal(body, &req) != nil || m == nil || bytes.Contains(body, []byte("_recall_")) {
		return "", "", ""
	}
	for _, t := range req.Tools {
		for _, name := range []string{t.Name, t.Function.Name} {
			if strings.HasSuffix(name, "imgctx_recall") {
				in, _ := json.Marshal(map[string]string{"handle": string(m[1])})
				return name, string(in), "call_recall_"
			}
		}
	}
	// Both list MCP tools as deferred: claude-code loads one with
	// ToolSearch, qwen-code calls it through its tool_call bridge.
	const deferred = "mcp__imgctx__imgctx_recall"
	if !bytes.Contains(body, []byte(deferred)) {
		return "", "", ""
	}
	for _, t := range req.Tools {
		if t.Function.Name == "tool_call" {
			in, _ := json.Marshal(map[string]any{"name": deferred, "arguments": map[string]string{"handle": string(m[1])}})
			return "tool_call", string(in), "call_recall_"
		}
	}
	if !bytes.Contains(body, []byte("toolu_search_")) {
		return "ToolSearch", `{"query":"select:` + deferred + `"}`, "toolu_search_"
	}
	return "", "", ""
}

var (
	imageData = regexp.MustCompile(`"data":"[A-Za-z0-9+/=]*"`)
	dataURL   = regexp.MustCompile(`"url":"data:image/[a-z]+;base64,[A-Za-z0-9+/=]*"`)
)

// billed bills a request as the provider would, near enough for imgctx to
// measure: its text at four characters a token, and each image (found by
// the wire's pattern) at what a 1280×800 screenshot costs there — 1,334
// tokens on Claude's rule, 765 on gpt-4o's tiles. (A flat count would tell
// imgctx the model sees no images.)
func billed(body []byte, image *regexp.Regexp, perImage int) int {
	images := image.FindAll(body, -1)
	text := len(body)
	for _, d := range images {
		text -= len(d)
	}
	return text/4 + perImage*len(images)
}

func claudeInput(body []byte) int { return billed(body, imageData, 1334) }

func openaiInput(body []byte) int { return billed(body, dataURL, 765) }

// recallRun is the recall check: claude-code and qwen-code, each given
// imgctx's MCP server with its own `mcp add`, through an imgctx serve
// whose budget keeps no screenshot across turns (keep.hold off) and whose
// markers carry recall handles. Each first session reads screenshot.png;
// resumed, the screenshot is a marker with a handle, the scripted upstream
// calls the recall tool with it, the agent runs the tool against /mcp, and
// its next request must carry the screenshot back, byte for byte, after
// the call.
func recallRun(bin, work, cache string, env []string, up string, atUpstream *recorded) bool {
	dir := filepath.Join(work, "recall")
	os.MkdirAll(dir, 0o755)
	cfg := filepath.Join(dir, "imgctx.yaml")
	os.WriteFile(cfg, []byte(fmt.Sprintf("upstreams:\n  - {name: claude, format: anthropic, base_url: %q, models: [\"claude-*\"]}\n  - {name: local, format: openai, base_url: %q}\n"+
		"keep: {hold: false, budget_fraction: 0.001}\nproxy: {recall: true}\n", up, up)), 0o644)
	serve, gw := start(bin, filepath.Join(dir, "data"), "--config", cfg)
	defer serve.Process.Kill()
	env = append(slices.Clone(env), "ANTHROPIC_BASE_URL="+gw.String(), "OPENAI_BASE_URL="+gw.String()+"/v1", "HOME="+filepath.Join(dir, "home"))
	run := func(agent string, args ...string) string {
		cmd := exec.Command(filepath.Join(cache, "node_modules", ".bin", agent), args...)
		cmd.Dir, cmd.Env = work, env // where screenshot.png is
		out, _ := cmd.CombinedOutput()
		return strings.TrimSpace(lastLine(string(out)))
	}
	fmt.Println("| agent with imgctx's MCP server | mcp add | first session | resumed: the marker's handle | the screenshot back after the call, byte for byte | answer |")
	fmt.Println("|---|---|---|---|---|---|")
	ok := true
	for _, a := range []struct {
		name, bin  string
		add, first []string
		second     []string
	}{
		{"claude-code 2.1.332", "claude", []string{"mcp", "add", "--transport", "http", "imgctx", gw.String() + "/mcp"},
			[]string{"-p", "Describe screenshot.png", "--output-format", "text"},
			[]string{"-c", "-p", "What did the screenshot show? Look again if you need to.", "--output-format", "text", "--allowedTools", "mcp__imgctx"}},
		{"qwen-code 0.24.4", "qwen", []string{"mcp", "add", "--transport", "http", "imgctx", gw.String() + "/mcp"},
			[]string{"-p", "Describe screenshot.png", "--yolo"},
			[]string{"-c", "-p", "What did the screenshot show? Look again if you need to.", "--yolo"}},
	} {
		added := run(a.bin, a.add...)
		firstAt := atUpstream.count()
		first := run(a.bin, a.first...)
		upBefore := atUpstream.count()
		var sent [][]byte // the screenshot as the agent sent it (qwen-code re-encodes it as JPEG)
		for _, b := range atUpstream.since(firstAt)[:upBefore-firstAt] {
			sent = append(sent, base64Image.FindAll(b, -1)...)
		}
		second := run(a.bin, a.second...)
		marker, back := "", false
		for _, b := range atUpstream.since(upBefore) {
			if m := handleIn.FindSubmatch(b); m != nil && marker == "" {
				marker = string(m[1])
			}
			back = back || recalledBack(b, sent)
		}
		ok = ok && marker != "" && back && strings.Contains(second, "scripted upstream")
		fmt.Printf("| %s | %q | %q | %q | %v | %q |\n", a.name, added, first, marker, back, second)
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
