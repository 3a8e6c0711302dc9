package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
)

// FromFile reads a recorded session as a workload: either the sessions
// API's export (JSONL, docs/format.md; images are stored by ref there, so
// each is replayed as a synthetic PNG of its recorded size, which is what
// its tokens depend on), or one request body a line, in OpenAI Chat
// Completions or Anthropic Messages format, as a proxy sees them (each
// line the whole history so far). think is the time between two requests
// when the file does not record it.
func FromFile(r io.Reader, think time.Duration) (*Workload, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	first, _, _ := bytes.Cut(bytes.TrimSpace(data), []byte("\n"))
	var probe struct {
		Type     string          `json:"type"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(first, &probe); err != nil {
		return nil, fmt.Errorf("--from: the first line is not JSON: %v", err)
	}
	switch {
	case probe.Type == "session":
		snap, err := session.ImportJSONL(bytes.NewReader(data))
		if err != nil {
			return nil, fmt.Errorf("--from: %w", err)
		}
		return fromExport(snap)
	case probe.Messages != nil:
		return fromRequests(data, think)
	}
	return nil, fmt.Errorf("--from: neither a session export (first line type session) nor request bodies (a messages array)")
}

// images gives each distinct image of a recording one *Image.
type images struct {
	w    *Workload
	seen map[string]*Image
}

func (im *images) get(key string, make func() *Image) *Image {
	if i, ok := im.seen[key]; ok {
		im.w.Occurrences++
		im.w.OccBytes += int64(i.Bytes)
		return i
	}
	i := make()
	i.ID = len(im.w.Images) + 1
	im.seen[key] = i
	im.w.Images = append(im.w.Images, i)
	im.w.Occurrences++
	im.w.OccBytes += int64(i.Bytes)
	return i
}

// maxSynthPixels bounds the images an export makes us draw: its sizes are
// data, and a PNG of them is allocated whole.
const maxSynthPixels = 40_000_000

func fromExport(snap session.Snapshot) (*Workload, error) {
	w := &Workload{Name: "from " + string(snap.Meta.ID), Tools: "[]"}
	im := &images{w: w, seen: map[string]*Image{}}
	var pending []Msg
	var last time.Time
	flush := func(at time.Time) {
		if len(pending) == 0 {
			return
		}
		think := time.Duration(0)
		if !last.IsZero() {
			think = at.Sub(last)
		}
		w.Steps = append(w.Steps, Step{Think: think, Add: pending})
		pending, last = nil, at
	}
	for _, e := range snap.Log {
		if e.Message == nil {
			continue
		}
		m := *e.Message
		switch m.Role {
		case chat.System:
			w.System += m.TextContent()
			continue
		case chat.Assistant:
			// A request ran before each reply: what came before it is one step.
			flush(e.At)
		}
		msg := Msg{Role: "user", Human: m.Role == chat.User}
		if m.Role == chat.Assistant {
			msg.Role = "assistant"
		}
		parts, err := im.parts(m.Parts)
		if err != nil {
			return nil, fmt.Errorf("--from: entry %d: %w", e.Seq, err)
		}
		msg.Parts = parts
		for _, p := range msg.Parts {
			if p.Result != nil {
				msg.Human = false
			}
		}
		pending = append(pending, msg)
	}
	// What follows the last reply was never sent: a request needs a user
	// message or tool result after it.
	for _, m := range pending {
		if m.Role == "user" {
			flush(last.Add(time.Second))
			break
		}
	}
	return w, nil
}

func (im *images) parts(ps []chat.Part) ([]Part, error) {
	var out []Part
	for _, p := range ps {
		switch p := p.(type) {
		case chat.Text:
			out = append(out, Part{Text: p.Text})
		case chat.Image:
			if p.Width <= 0 || p.Height <= 0 || int64(p.Width)*int64(p.Height) > maxSynthPixels {
				return nil, fmt.Errorf("image %s is %d×%d: replayed images are drawn at their recorded size, 1 to %d pixels", p.Ref, p.Width, p.Height, maxSynthPixels)
			}
			origin := "user"
			if p.Origin == chat.FromTool {
				origin = "tool"
			}
			img := im.get(p.Ref.String(), func() *Image {
				g := &gen{rng: newRand(uint64(len(im.w.Images) + 1)), p: Params{Width: max(p.Width, 1), Height: max(p.Height, 1)}}
				g.images = im.w.Images
				return g.image(origin)
			})
			out = append(out, Part{Image: img})
		case chat.ToolCall:
			args := p.Arguments
			if args == "" {
				args = "{}"
			}
			out = append(out, Part{Call: &Call{ID: p.ID, Name: p.Name, Input: args}})
		case chat.ToolResult:
			inner, err := im.parts(p.Parts)
			if err != nil {
				return nil, err
			}
			out = append(out, Part{Result: &Result{CallID: p.CallID, Parts: inner}})
		case chat.Marker:
			out = append(out, Part{Text: p.String()})
		case chat.Summary:
			out = append(out, Part{Text: p.Text})
		}
	}
	return out, nil
}

// fromRequests reads request bodies, one a line: each step appends what a
// body has beyond the one before; a body that does not begin with the one
// before (the client compacted) starts the transcript again.
func fromRequests(data []byte, think time.Duration) (*Workload, error) {
	w := &Workload{Name: "from requests"}
	im := &images{w: w, seen: map[string]*Image{}}
	var prev []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 512<<20)
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		var req struct {
			System   json.RawMessage   `json:"system"`
			Tools    json.RawMessage   `json:"tools"`
			Messages []json.RawMessage `json:"messages"`
		}
		if err := json.Unmarshal(text, &req); err != nil {
			return nil, fmt.Errorf("--from line %d: %v", line, err)
		}
		msgs := make([]string, len(req.Messages))
		for i, m := range req.Messages {
			// A breakpoint moves to the newest message each request: it is
			// not part of what the message is.
			msgs[i] = cacheControl.ReplaceAllString(string(m), "")
		}
		if w.System == "" {
			w.System = systemText(req.System, req.Messages)
			w.Tools = anthropicTools(req.Tools)
		}
		from := 0
		reset := false
		if len(prev) <= len(msgs) && equalStrings(prev, msgs[:len(prev)]) {
			from = len(prev)
		} else {
			reset = true
		}
		var add []Msg
		afterTool := false
		for _, raw := range req.Messages[from:] {
			m, ok, err := im.wireMessage(raw)
			if err != nil {
				return nil, fmt.Errorf("--from line %d: %v", line, err)
			}
			if !ok {
				continue
			}
			if afterTool && m.Role == "user" && onlyImages(m) {
				m.Human = false // OpenAI Chat: the screenshot a tool message could not hold
			}
			afterTool = len(m.Parts) > 0 && m.Parts[0].Result != nil
			add = append(add, m)
		}
		st := Step{Think: think, Add: add, Reset: reset && len(w.Steps) > 0}
		if len(w.Steps) == 0 {
			st.Think = 0
		}
		w.Steps = append(w.Steps, st)
		prev = msgs
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(w.Steps) == 0 {
		return nil, fmt.Errorf("--from: no request in the file")
	}
	return w, nil
}

var cacheControl = regexp.MustCompile(`,?"cache_control":\{[^{}]*\}`)

func onlyImages(m Msg) bool {
	for _, p := range m.Parts {
		if p.Image == nil {
			return false
		}
	}
	return len(m.Parts) > 0
}

func equalStrings(a, b []string) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func systemText(system json.RawMessage, msgs []json.RawMessage) string {
	if len(system) > 0 {
		if system[0] == '"' {
			return unquote(system)
		}
		var parts []struct{ Text string }
		json.Unmarshal(system, &parts)
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	for _, raw := range msgs {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		json.Unmarshal(raw, &m)
		if m.Role == "system" || m.Role == "developer" {
			return contentText(m.Content)
		}
	}
	return ""
}

// anthropicTools returns a tool list in the Anthropic shape the renderer
// takes, from either wire's.
func anthropicTools(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "[]"
	}
	var tools []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"input_schema"`
		Function    *struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		} `json:"function"`
	}
	json.Unmarshal(raw, &tools)
	type tool struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"input_schema"`
	}
	var out []tool
	for _, t := range tools {
		if t.Function != nil {
			out = append(out, tool{t.Function.Name, t.Function.Description, t.Function.Parameters})
		} else if t.Name != "" {
			out = append(out, tool{t.Name, t.Description, t.Schema})
		}
	}
	for i := range out {
		if len(out[i].Schema) == 0 {
			out[i].Schema = json.RawMessage(`{"type":"object"}`)
		}
	}
	b, _ := json.Marshal(out)
	if out == nil {
		return "[]"
	}
	return string(b)
}

func contentText(c json.RawMessage) string {
	if len(c) > 0 && c[0] == '"' {
		return unquote(c)
	}
	var parts []struct{ Type, Text string }
	json.Unmarshal(c, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// wireMessage reads one message of either wire; system messages are the
// workload's system prompt, not steps (ok false).
func (im *images) wireMessage(raw json.RawMessage) (Msg, bool, error) {
	var m struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCalls  []json.RawMessage
		ToolCallID string `json:"tool_call_id"`
	}
	var calls struct {
		ToolCalls []struct {
			ID       string `json:"id"`
			Function struct {
				Name      string `json:"name"`
				Arguments string `json:"arguments"`
			} `json:"function"`
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(raw, &m); err != nil {
		return Msg{}, false, err
	}
	json.Unmarshal(raw, &calls)
	switch m.Role {
	case "system", "developer":
		return Msg{}, false, nil
	case "tool":
		return Msg{Role: "user", Parts: []Part{{Result: &Result{CallID: m.ToolCallID, Parts: []Part{{Text: contentText(m.Content)}}}}}}, true, nil
	}
	out := Msg{Role: m.Role}
	parts, err := im.blocks(m.Content)
	if err != nil {
		return Msg{}, false, err
	}
	out.Parts = parts
	for _, c := range calls.ToolCalls {
		args := c.Function.Arguments
		if args == "" {
			args = "{}"
		}
		out.Parts = append(out.Parts, Part{Call: &Call{ID: c.ID, Name: c.Function.Name, Input: args}})
	}
	if out.Role == "user" {
		out.Human = true
		for _, p := range out.Parts {
			if p.Result != nil {
				out.Human = false
			}
		}
	}
	return out, true, nil
}

// blocks reads content: a string, OpenAI parts or Anthropic blocks.
func (im *images) blocks(c json.RawMessage) ([]Part, error) {
	if len(c) == 0 || string(c) == "null" {
		return nil, nil
	}
	if c[0] == '"' {
		return []Part{{Text: unquote(c)}}, nil
	}
	var raw []struct {
		Type     string          `json:"type"`
		Text     string          `json:"text"`
		ID       string          `json:"id"`
		Name     string          `json:"name"`
		Input    json.RawMessage `json:"input"`
		UseID    string          `json:"tool_use_id"`
		Content  json.RawMessage `json:"content"`
		ImageURL *struct {
			URL string `json:"url"`
		} `json:"image_url"`
		Source *struct {
			Type      string `json:"type"`
			MediaType string `json:"media_type"`
			Data      string `json:"data"`
		} `json:"source"`
	}
	if err := json.Unmarshal(c, &raw); err != nil {
		return nil, err
	}
	var out []Part
	for _, b := range raw {
		switch {
		case b.Type == "image_url" && b.ImageURL != nil:
			_, data, ok := strings.Cut(b.ImageURL.URL, ";base64,")
			if !ok {
				out = append(out, Part{Text: "[image by URL]"})
				continue
			}
			p := im.inline(data)
			if mt, _, ok := strings.Cut(strings.TrimPrefix(b.ImageURL.URL, "data:"), ";"); ok {
				p.Image.MediaType = mt
			}
			out = append(out, p)
		case b.Type == "image" && b.Source != nil && b.Source.Type == "base64":
			p := im.inline(b.Source.Data)
			p.Image.MediaType = b.Source.MediaType
			out = append(out, p)
		case b.Type == "tool_use":
			in := string(b.Input)
			if in == "" {
				in = "{}"
			}
			out = append(out, Part{Call: &Call{ID: b.ID, Name: b.Name, Input: in}})
		case b.Type == "tool_result":
			inner, err := im.blocks(b.Content)
			if err != nil {
				return nil, err
			}
			out = append(out, Part{Result: &Result{CallID: b.UseID, Parts: inner}})
		default:
			out = append(out, Part{Text: b.Text})
		}
	}
	return out, nil
}

// inline is an image recorded with its bytes: replayed as it was.
func (im *images) inline(b64 string) Part {
	img := im.get(b64, func() *Image {
		w, h, _ := imageSize(b64)
		return &Image{W: w, H: h, Bytes: len(b64) * 3 / 4, B64: b64, Origin: "user"}
	})
	return Part{Image: img}
}
