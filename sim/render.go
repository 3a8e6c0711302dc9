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
	b.Grow(1 << 16)
	if format == "anthropic" {
		b.WriteString(`{"model":`)
		quote(&b, model)
		b.WriteString(`,"max_tokens":1024,"system":[{"type":"text","text":`)
		quote(&b, system)
		b.WriteString(`,"cache_control":{"type":"ephemeral"}}],"tools":`)
		b.WriteString(tools)
		b.WriteString(`,"messages":[`)
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
				last := i == len(msgs)-1 && j == len(m.Parts)-1
				writeAnthropicPart(&b, p, stripImages, last)
			}
			b.WriteString(`]}`)
		}
		b.WriteString(`]}`)
		return b.Bytes()
	}
	b.WriteString(`{"model":`)
	quote(&b, model)
	b.WriteString(`,"max_tokens":1024,"tools":`)
	b.WriteString(openaiTools(tools))
	b.WriteString(`,"messages":[{"role":"system","content":`)
	quote(&b, system)
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
			quote(&b, text)
			if len(calls) > 0 {
				b.WriteString(`,"tool_calls":[`)
				for k, c := range calls {
					if k > 0 {
						b.WriteByte(',')
					}
					b.WriteString(`{"id":`)
					quote(&b, c.ID)
					b.WriteString(`,"type":"function","function":{"name":`)
					quote(&b, c.Name)
					b.WriteString(`,"arguments":`)
					quote(&b, c.Input)
					b.WriteString(`}}`)
				}
				b.WriteByte(']')
			}
			b.WriteByte('}')
		case len(m.Parts) > 0 && m.Parts[0].Result != nil:
			for _, p := range m.Parts {
				r := p.Result
				b.WriteString(`,{"role":"tool","tool_call_id":`)
				quote(&b, r.CallID)
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
				quote(&b, text)
				b.WriteByte('}')
				if len(images) > 0 {
					b.WriteString(`,{"role":"user","content":[`)
					for k, in := range images {
						if k > 0 {
							b.WriteByte(',')
						}
						writeOpenAIPart(&b, in, stripImages)
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
				writeOpenAIPart(&b, p, stripImages)
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

// openaiTools rewrites the Anthropic tool list as Chat Completions tools.
func openaiTools(tools string) string {
	var in []struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Schema      json.RawMessage `json:"input_schema"`
	}
	json.Unmarshal([]byte(tools), &in)
	type fn struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	type tool struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	out := make([]tool, len(in))
	for i, t := range in {
		out[i] = tool{"function", fn{t.Name, t.Description, t.Schema}}
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
