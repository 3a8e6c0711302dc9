package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// workdir is the folder the agent running now works in (the runs go one
// at a time): the files the scripted upstream asks it to read are there,
// since qwen-code and gemini-cli read only inside their workspace.
var workdir struct {
	sync.Mutex
	path string
}

func setWorkdir(dir string) {
	workdir.Lock()
	workdir.path = dir
	workdir.Unlock()
}

func inWorkdir(name string) string {
	workdir.Lock()
	defer workdir.Unlock()
	return filepath.Join(workdir.path, name)
}

// inflated, when set, is the prompt the Chat Completions and Messages
// answers report for a request that carries an image (compactionRun):
// what makes an agent's history pass its compaction point. refuseTwo
// refuses a Messages request carrying two images or more, but a summary
// request, as prompt-too-long (claudeCompactionRun).
// padded, when set, is added to every Messages request's bill: text the
// conversation is taken to carry, its images still billed at their cost
// (claudeRefusedRun, through imgctx, which measures an image by the bill).
// window, when set, is the Messages upstream's context window: a request
// billed past it is refused as prompt-too-long, as the provider refuses
// it, a summary request too (claudeClientWindowRun).
var (
	inflated  atomic.Int64
	refuseTwo atomic.Bool
	padded    atomic.Int64
	window    atomic.Int64
)

// shotTokens is what the Messages upstream bills a screenshot: Claude's
// 1280×800 on the standard tier.
const shotTokens = 1334

// summaryRequest: claude-code's compaction request, which must be answered
// with text (2.1.332 sends it with its tools, 2.0.77 with its read tool).
func summaryRequest(body []byte) bool {
	return bytes.Contains(body, []byte("Respond with TEXT ONLY")) ||
		bytes.Contains(body, []byte("create a detailed summary of the conversation so far"))
}

// calls numbers the scripted tool calls and answers: each id once, as the
// provider's (claude-code merges the blocks of answers with one id).
var calls atomic.Int64

// reply is what the scripted model answers: a call of tool with input (a
// JSON object), or text when tool is "".
type reply struct{ tool, input, id string }

// scripted answers like the provider would, on the request's own wire:
// a call of the agent's read tool while the human's prompt names a file
// not read yet, a recall call on reading a marker with a handle, else
// text. Usage bills the request as the provider would (billed).
func scripted(w http.ResponseWriter, r *http.Request, body []byte) {
	path := r.URL.Path
	switch {
	case strings.HasSuffix(path, "/count_tokens"):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"input_tokens":42}`)
		return
	case strings.Contains(path, ":countTokens"):
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"totalTokens":42}`)
		return
	}
	rep := decide(body)
	switch {
	case strings.HasSuffix(path, "/chat/completions"):
		writeChat(w, body, rep)
	case strings.HasSuffix(path, "/responses"):
		writeResponses(w, body, rep)
	case strings.Contains(path, "GenerateContent") || strings.Contains(path, "generateContent"):
		writeGemini(w, r, body, rep)
	default:
		writeMessages(w, body, rep)
	}
}

func decide(body []byte) reply {
	if summaryRequest(body) {
		return reply{}
	}
	if tool, input, id := asksToRecall(body); tool != "" {
		return reply{tool, input, id}
	}
	file := nextFile(body)
	if file == "" && asksForTheScreenshot(body) {
		file = "screenshot.png"
	}
	if file == "" {
		return reply{}
	}
	tool, param := readTool(body)
	if tool == "" {
		return reply{} // a side request (a title, a summary): no tools
	}
	in, _ := json.Marshal(map[string]string{param: inWorkdir(file)})
	return reply{tool, string(in), "call_"}
}

// readPrompt is how the budget run's human asks for files one a request.
var readPrompt = regexp.MustCompile(`one at a time: ((?:[a-z]-\d\.png ?)+)`)

// nextFile: the files the last such prompt in the body names, the first
// no tool call of the body names yet (by its absolute path, which only a
// call carries); "" when there is none or all are read.
func nextFile(body []byte) string {
	m := readPrompt.FindAllSubmatch(body, -1)
	if m == nil {
		return ""
	}
	for _, name := range strings.Fields(string(m[len(m)-1][1])) {
		if !bytes.Contains(body, []byte(inWorkdir(name))) {
			return name
		}
	}
	return ""
}

// readTool is the agent's tool that reads a file, as its request lists
// it on any wire, and the parameter that takes the path.
func readTool(body []byte) (tool, param string) {
	type schema struct{ Properties map[string]json.RawMessage }
	var req struct {
		Tools []struct {
			Name        string
			InputSchema schema `json:"input_schema"`
			Parameters  schema
			Function    struct {
				Name       string
				Parameters schema
			}
			FunctionDeclarations []struct {
				Name                 string
				Parameters           schema
				ParametersJSONSchema schema `json:"parametersJsonSchema"`
			}
		}
	}
	if json.Unmarshal(body, &req) != nil {
		return "", ""
	}
	pick := func(name string, schemas ...schema) bool {
		switch name {
		case "Read", "read_file", "view_image", "read":
		default:
			return false
		}
		for _, s := range schemas {
			for _, p := range []string{"file_path", "absolute_path", "path", "filePath"} {
				if _, ok := s.Properties[p]; ok {
					tool, param = name, p
					return true
				}
			}
		}
		return false
	}
	for _, t := range req.Tools {
		if pick(t.Name, t.InputSchema, t.Parameters) || pick(t.Function.Name, t.Function.Parameters) {
			return
		}
		for _, f := range t.FunctionDeclarations {
			if pick(f.Name, f.Parameters, f.ParametersJSONSchema) {
				return
			}
		}
	}
	return "", ""
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

const answer = "Hello from the scripted upstream."

func writeMessages(w http.ResponseWriter, body []byte, rep reply) {
	if refuseTwo.Load() && len(imageData.FindAll(body, -1)) >= 2 && !summaryRequest(body) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"},"request_id":"req_agentcheck"}`)
		return
	}
	in := billed(body, imageData, shotTokens) + int(padded.Load())
	if n := inflated.Load(); n > 0 && imageData.Match(body) {
		in = int(n)
	}
	if max := int(window.Load()); max > 0 && in > max {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: %d tokens > %d maximum"},"request_id":"req_agentcheck"}`, in, max)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	events := []string{`{"type":"message_start","message":{"id":"msg_` + fmt.Sprint(calls.Add(1)) + `","type":"message","role":"assistant","content":[],"model":` + strconv.Quote(requestModel(body)) + `,"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":` + fmt.Sprint(in) + `,"output_tokens":1}}}`}
	if rep.tool != "" {
		id := strings.Replace(rep.id, "call_", "toolu_", 1) + fmt.Sprint(calls.Add(1))
		events = append(events,
			`{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"`+id+`","name":`+strconv.Quote(rep.tool)+`,"input":{}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":`+strconv.Quote(rep.input)+`}}`,
			`{"type":"content_block_stop","index":0}`,
			`{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":20}}`)
	} else {
		text := answer
		if summaryRequest(body) {
			text = "<summary>" + answer + "</summary>" // claude-code asks again for a summary without its tags
		}
		events = append(events,
			`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"`+text+`"}}`,
			`{"type":"content_block_stop","index":0}`,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":7}}`)
	}
	events = append(events, `{"type":"message_stop"}`)
	for _, ev := range events {
		var t struct{ Type string }
		json.Unmarshal([]byte(ev), &t)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", t.Type, ev)
	}
}

func writeChat(w http.ResponseWriter, body []byte, rep reply) {
	w.Header().Set("Content-Type", "text/event-stream")
	id := fmt.Sprint("chatcmpl-", calls.Add(1))
	chunk := func(delta, finish string) string {
		return `{"id":"` + id + `","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[{"index":0,"delta":` + delta + `,"finish_reason":` + finish + `}]}`
	}
	var events []string
	if rep.tool != "" {
		events = []string{chunk(`{"role":"assistant","tool_calls":[{"index":0,"id":"`+rep.id+fmt.Sprint(calls.Add(1))+`","type":"function","function":{"name":`+strconv.Quote(rep.tool)+`,"arguments":`+strconv.Quote(rep.input)+`}}]}`, "null"),
			chunk(`{}`, `"tool_calls"`)}
	} else {
		events = []string{chunk(`{"role":"assistant","content":"`+answer+`"}`, "null"), chunk(`{}`, `"stop"`)}
	}
	in := billed(body, dataURL, 1002)
	if n := inflated.Load(); n > 0 && dataURL.Match(body) {
		in = int(n)
	}
	events = append(events, `{"id":"`+id+`","object":"chat.completion.chunk","created":1,"model":"qwen3-coder-plus","choices":[],"usage":{"prompt_tokens":`+fmt.Sprint(in)+`,"completion_tokens":20,"total_tokens":`+fmt.Sprint(in+20)+`}}`)
	for _, ev := range events {
		fmt.Fprintf(w, "data: %s\n\n", ev)
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

func writeResponses(w http.ResponseWriter, body []byte, rep reply) {
	w.Header().Set("Content-Type", "text/event-stream")
	n := fmt.Sprint(calls.Add(1))
	item := `{"type":"message","id":"msg_` + n + `","status":"completed","role":"assistant","content":[{"type":"output_text","text":"` + answer + `","annotations":[]}]}`
	if rep.tool != "" {
		item = `{"type":"function_call","id":"fc_` + n + `","call_id":"` + rep.id + n + `","name":` + strconv.Quote(rep.tool) + `,"arguments":` + strconv.Quote(rep.input) + `,"status":"completed"}`
	}
	in := billed(body, responsesImage, 910)
	for _, ev := range []string{
		`{"type":"response.created","sequence_number":0,"response":{"id":"resp_` + n + `","object":"response","created_at":1,"status":"in_progress","model":"gpt-5.1-codex","output":[]}}`,
		`{"type":"response.output_item.added","sequence_number":1,"output_index":0,"item":` + item + `}`,
		`{"type":"response.output_item.done","sequence_number":2,"output_index":0,"item":` + item + `}`,
		`{"type":"response.completed","sequence_number":3,"response":{"id":"resp_` + n + `","object":"response","created_at":1,"status":"completed","model":"gpt-5.1-codex","output":[` + item + `],"usage":{"input_tokens":` + fmt.Sprint(in) + `,"input_tokens_details":{"cached_tokens":0},"output_tokens":7,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":` + fmt.Sprint(in+7) + `}}}`,
	} {
		var t struct{ Type string }
		json.Unmarshal([]byte(ev), &t)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", t.Type, ev)
	}
}

func writeGemini(w http.ResponseWriter, r *http.Request, body []byte, rep reply) {
	part := `{"text":"` + answer + `"}`
	if rep.tool != "" {
		part = `{"functionCall":{"name":` + strconv.Quote(rep.tool) + `,"args":` + rep.input + `}}`
	}
	in := billed(body, imageData, 1032)
	final := `{"candidates":[{"content":{"role":"model","parts":[` + part + `]},"finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":` + fmt.Sprint(in) + `,"candidatesTokenCount":7,"totalTokenCount":` + fmt.Sprint(in+7) + `},"modelVersion":"gemini-2.5-pro"}`
	if strings.Contains(r.URL.Path, ":streamGenerateContent") {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\r\n\r\n", final)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, final)
}

var (
	imageData      = regexp.MustCompile(`"data":"[A-Za-z0-9+/=]*"`)
	dataURL        = regexp.MustCompile(`"url":"data:image/[a-z]+;base64,[A-Za-z0-9+/=]*"`)
	responsesImage = regexp.MustCompile(`"image_url":"data:image/[a-z]+;base64,[A-Za-z0-9+/=]*"`)
)

// billed bills a request as the provider would, near enough for imgctx to
// measure: its text at four characters a token, and each image (found by
// the wire's pattern) at what a 1280×800 screenshot costs on the model's
// profile (imgctx estimate): 1,334 tokens on Claude, 1,002 on Qwen-VL, 910
// on GPT-5, 1,032 on Gemini 2.5. (A flat count would tell imgctx the
// model sees no images.)
func billed(body []byte, image *regexp.Regexp, perImage int) int {
	images := image.FindAll(body, -1)
	text := len(body)
	for _, d := range images {
		text -= len(d)
	}
	return text/4 + perImage*len(images)
}
