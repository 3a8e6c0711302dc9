package sim

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// render writes a transcript as one request body in the wire format
// ("anthropic": Messages with a breakpoint on the system prompt and one on
// the last block, as claude-code places them; "openai": Chat Completions,
// a tool's screenshot in a user message after the tool message, since a
// tool message holds text only). stripImages writes "[image]" for every
// image (a summary request).
func render(format, model, system, tools string, msgs []Msg, stripImages bool) []byte {
	var b bytes.Buffer
	return renderInto(&b, format, model, system, tools, msgs, stripImages, lastBreakpoint)
}

// Where an Anthropic agent puts its cache breakpoints (besides the one on
// the system prompt).
const (
	lastBreakpoint     = iota // on the last block, as claude-code does
	turnBreakpoints           // on the last block of each of the 3 latest user messages, as the reference computer-use loop does (_inject_prompt_caching)
	noBreakpoints             // none at all, the system prompt's included: caching off
	lastTwoBreakpoints        // on the last block of each of the last 2 messages, as opencode does
)

// renderInto is render into a buffer the caller reuses: a body of real
// screenshots weighs tens of MB, and allocating it anew at every step is
// most of the simulator's time.
func renderInto(b *bytes.Buffer, format, model, system, tools string, msgs []Msg, stripImages bool, bps int) []byte {
	b.Reset()
	b.Grow(1<<16 + len(system) + len(tools) + imageBytes(msgs)) // one allocation: real screenshots weigh megabytes
	if format == "anthropic" {
		b.WriteString(`{"model":`)
		quote(b, model)
		b.WriteString(`,"max_tokens":1024,"system":[{"type":"text","text":`)
		quote(b, system)
		if bps != noBreakpoints {
			b.WriteString(`,"cache_control":{"type":"ephemeral"}`)
		}
		b.WriteString(`}],"tools":`)
		b.WriteString(tools)
		b.WriteString(`,"messages":[`)
		marked := map[int]bool{len(msgs) - 1: bps == lastBreakpoint || bps == lastTwoBreakpoints, len(msgs) - 2: bps == lastTwoBreakpoints}
		if bps == turnBreakpoints {
			for i, n := len(msgs)-1, 0; i >= 0 && n < 3; i-- {
				if msgs[i].Role == "user" {
					marked[i] = true
					n++
				}
			}
		}
		for i, m := range msgs {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"role":"`)
			b.WriteString(m.Role)
			b.WriteString(`","content":[`)
			for j, p := range m.Parts {
				if j > 0 {
					b.WriteByte(',')
				}
				last := marked[i] && j == len(m.Parts)-1
				writeAnthropicPart(b, p, stripImages, last)
			}
			b.WriteString(`]}`)
		}
		b.WriteString(`]}`)
		return b.Bytes()
	}
	if format == "gemini" {
		renderGemini(b, system, tools, msgs, stripImages)
		return b.Bytes()
	}
	b.WriteString(`{"model":`)
	quote(b, model)
	b.WriteString(`,"max_tokens":1024,"tools":`)
	b.WriteString(openaiTools(tools))
	b.WriteString(`,"messages":[{"role":"system","content":`)
	quote(b, system)
	b.WriteByte('}')
	for _, m := range msgs {
		switch {
		case m.Role == "assistant":
			b.WriteString(`,{"role":"assistant","content":`)
			text, calls := "", []*Call{}
			for _, p := range m.Parts {
				if p.Call != nil {
					calls = append(calls, p.Call)
				} else {
					text += p.Text
				}
			}
			quote(b, text)
			if len(calls) > 0 {
				b.WriteString(`,"tool_calls":[`)
				for k, c := range calls {
					if k > 0 {
						b.WriteByte(',')
					}
					b.WriteString(`{"id":`)
					quote(b, c.ID)
					b.WriteString(`,"type":"function","function":{"name":`)
					quote(b, c.Name)
					b.WriteString(`,"arguments":`)
					quote(b, c.Input)
					b.WriteString(`}}`)
				}
				b.WriteByte(']')
			}
			b.WriteByte('}')
		case len(m.Parts) > 0 && m.Parts[0].Result != nil:
			for _, p := range m.Parts {
				r := p.Result
				b.WriteString(`,{"role":"tool","tool_call_id":`)
				quote(b, r.CallID)
				b.WriteString(`,"content":`)
				text := ""
				var images []Part
				for _, in := range r.Parts {
					if in.Image != nil || in.Removed != "" {
						images = append(images, in)
					} else {
						text += in.Text
					}
				}
				quote(b, text)
				b.WriteByte('}')
				if len(images) > 0 {
					b.WriteString(`,{"role":"user","content":[`)
					for k, in := range images {
						if k > 0 {
							b.WriteByte(',')
						}
						writeOpenAIPart(b, in, stripImages)
					}
					b.WriteString(`]}`)
				}
			}
		default:
			b.WriteString(`,{"role":"user","content":[`)
			for k, p := range m.Parts {
				if k > 0 {
					b.WriteByte(',')
				}
				writeOpenAIPart(b, p, stripImages)
			}
			b.WriteString(`]}`)
		}
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

func quote(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s)
	b.Write(q)
}

const placeholder = "[screenshot removed to save context]"

func writeAnthropicPart(b *bytes.Buffer, p Part, strip, breakpoint bool) {
	cc := ""
	if breakpoint {
		cc = `,"cache_control":{"type":"ephemeral"}`
	}
	switch {
	case p.Result != nil:
		b.WriteString(`{"type":"tool_result","tool_use_id":`)
		quote(b, p.Result.CallID)
		b.WriteString(`,"content":[`)
		for k, in := range p.Result.Parts {
			if k > 0 {
				b.WriteByte(',')
			}
			writeAnthropicPart(b, in, strip, false)
		}
		b.WriteString(`]` + cc + `}`)
	case p.Call != nil:
		b.WriteString(`{"type":"tool_use","id":`)
		quote(b, p.Call.ID)
		b.WriteString(`,"name":`)
		quote(b, p.Call.Name)
		b.WriteString(`,"input":` + p.Call.Input + cc + `}`)
	case p.Image != nil && !strip && p.Image.Pages > 0:
		b.WriteString(`{"type":"document","source":{"type":"base64","media_type":"application/pdf","data":"`)
		b.WriteString(p.Image.B64)
		b.WriteString(`"}` + cc + `}`)
	case p.Image != nil && !strip:
		b.WriteString(`{"type":"image","source":{"type":"base64","media_type":"` + p.Image.mediaType() + `","data":"`)
		b.WriteString(p.Image.B64)
		b.WriteString(`"}` + cc + `}`)
	case p.Image != nil || p.Removed != "":
		b.WriteString(`{"type":"text","text":` + strconv.Quote(imageText(p)) + cc + `}`)
	default:
		b.WriteString(`{"type":"text","text":`)
		quote(b, p.Text)
		b.WriteString(cc + `}`)
	}
}

func imageText(p Part) string {
	if p.Removed != "" {
		return placeholder
	}
	return "[image]"
}

func writeOpenAIPart(b *bytes.Buffer, p Part, strip bool) {
	switch {
	case p.Image != nil && !strip && p.Image.Pages > 0:
		b.WriteString(`{"type":"file","file":{"filename":"document.pdf","file_data":"data:application/pdf;base64,`)
		b.WriteString(p.Image.B64)
		b.WriteString(`"}}`)
	case p.Image != nil && !strip:
		b.WriteString(`{"type":"image_url","image_url":{"url":"data:` + p.Image.mediaType() + `;base64,`)
		b.WriteString(p.Image.B64)
		b.WriteString(`"}}`)
	case p.Image != nil || p.Removed != "":
		b.WriteString(`{"type":"text","text":` + strconv.Quote(imageText(p)) + `}`)
	default:
		b.WriteString(`{"type":"text","text":`)
		quote(b, p.Text)
		b.WriteByte('}')
	}
}

// functions reads the Anthropic tool list as function declarations
// (name, description, parameters), the shape both other wires use.
func functions(tools string) []function {
	var in []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"input_schema"`
	}
	json.Unmarshal([]byte(tools), &in)
	out := make([]function, len(in))
	for i, t := range in {
		out[i] = function{t.Name, t.Description, t.Schema}
	}
	return out
}

type function struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// openaiTools rewrites the Anthropic tool list as Chat Completions tools.
func openaiTools(tools string) string {
	type tool struct {
		Type     string   `json:"type"`
		Function function `json:"function"`
	}
	fs := functions(tools)
	out := make([]tool, len(fs)) // [] for none, never null
	for i, f := range fs {
		out[i] = tool{"function", f}
	}
	b, _ := json.Marshal(out)
	return string(b)
}

func (im *Image) mediaType() string {
	if im.MediaType == "" {
		return "image/png"
	}
	return im.MediaType
}

// imageBytes is the base64 the images of msgs add to a body, at most.
func imageBytes(msgs []Msg) int {
	n := 0
	var walk func(parts []Part)
	walk = func(parts []Part) {
		for _, p := range parts {
			if p.Image != nil {
				n += len(p.Image.B64) + 128
			}
			if p.Result != nil {
				walk(p.Result.Parts)
			}
		}
	}
	for _, m := range msgs {
		walk(m.Parts)
	}
	return n
}

// renderGemini writes a generateContent body as gemini-cli sends one: the
// system prompt as systemInstruction, tools as functionDeclarations, and a
// tool's screenshot as an inlineData part beside its functionResponse in
// the user content that answers the call.
func renderGemini(b *bytes.Buffer, system, tools string, msgs []Msg, strip bool) {
	b.WriteString(`{"systemInstruction":{"parts":[{"text":`)
	quote(b, system)
	b.WriteString(`}]},"tools":[{"functionDeclarations":`)
	b.WriteString(geminiTools(tools))
	b.WriteString(`}],"contents":[`)
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		role := "user"
		if m.Role == "assistant" {
			role = "model"
		}
		b.WriteString(`{"role":"` + role + `","parts":[`)
		n := 0
		part := func() {
			if n > 0 {
				b.WriteByte(',')
			}
			n++
		}
		var media func(p Part)
		media = func(p Part) {
			switch {
			case p.Call != nil:
				part()
				b.WriteString(`{"functionCall":{"name":`)
				quote(b, p.Call.Name)
				b.WriteString(`,"args":` + p.Call.Input + `}}`)
			case p.Result != nil:
				text := ""
				for _, in := range p.Result.Parts {
					if in.Image == nil && in.Removed == "" {
						text += in.Text
					}
				}
				part()
				b.WriteString(`{"functionResponse":{"name":"tool","response":{"output":`)
				quote(b, text)
				b.WriteString(`}}}`)
				for _, in := range p.Result.Parts {
					if in.Image != nil || in.Removed != "" {
						media(in)
					}
				}
			case p.Image != nil && !strip:
				part()
				b.WriteString(`{"inlineData":{"mimeType":"` + p.Image.mediaType() + `","data":"`)
				b.WriteString(p.Image.B64)
				b.WriteString(`"}}`)
			case p.Image != nil || p.Removed != "":
				part()
				b.WriteString(`{"text":` + strconv.Quote(imageText(p)) + `}`)
			default:
				part()
				b.WriteString(`{"text":`)
				quote(b, p.Text)
				b.WriteByte('}')
			}
		}
		for _, p := range m.Parts {
			media(p)
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`]}`)
}

// geminiTools rewrites the Anthropic tool list as function declarations.
func geminiTools(tools string) string {
	b, _ := json.Marshal(functions(tools))
	return string(b)
}
