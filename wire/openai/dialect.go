package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/jsonspan"
)

// Dialect is OpenAI Chat Completions (/v1/chat/completions).
var Dialect = &wire.Dialect{
	Name: Wire, Scan: Scan, DecodeMessage: DecodeMessage,
	WriteSource: func(w *wire.BodyWriter, mediaType, b64 string) { wire.WriteDataURL(w, mediaType, b64) },
	WriteText:   func(w *wire.BodyWriter, text string, _ []byte) { WriteText(w, text) },
	Upstream:    Wire, AskUsage: includeUsage, Answer: answer, NewStream: func() wire.StreamReader { return &streamReader{} },
	FoldRelay: foldRelay,
	ErrorBody: ErrorBody, TooLong: TooLong, ModelList: modelList, EncodeSession: encodeSession, DecodeAnswer: decodeAnswer, DecodeRequest: decodeRequest, Complete: complete, Path: "/v1/chat/completions", Credentials: wire.Bearer, DecodeError: DecodeError,
}

func encodeSession(r wire.SessionRequest) (wire.Body, error) {
	req := NewRequest(r.Model)
	if len(r.Tools) > 0 {
		type function struct {
			Name        string          `json:"name"`
			Description string          `json:"description"`
			Parameters  json.RawMessage `json:"parameters"`
		}
		type tool struct {
			Type     string   `json:"type"`
			Function function `json:"function"`
		}
		tools := make([]tool, len(r.Tools))
		for i, t := range r.Tools {
			tools[i] = tool{"function", function{t.Name, t.Description, t.Parameters}}
		}
		req.top.Set("tools", mustJSON(tools))
	}
	req.memo = r.Memo
	b, err := req.EncodeBody(r.Messages, r.Source)
	if err == nil {
		r.Memo.Done()
	}
	return b, err
}

func decodeAnswer(b []byte) (wire.Answer, error) {
	r, err := DecodeResponse(b)
	if err != nil {
		return wire.Answer{}, err
	}
	return wire.Answer{Message: r.Message, Usage: r.Usage, Cut: r.Cut}, nil
}

func decodeRequest(body []byte) ([]chat.Message, bool, error) {
	req, err := DecodeRequest(body)
	if err != nil {
		return nil, false, err
	}
	return req.Messages, req.Stream, nil
}

// complete writes a whole answer as a chat completion, or as the chunks
// of one carrying the whole text.
func complete(model string, stream bool, a wire.Completion) (string, []byte) {
	id := wire.CompletionID()
	finish := "stop"
	if a.Cut {
		finish = "length"
	}
	usage := map[string]int{"prompt_tokens": a.Prompt, "completion_tokens": a.Output, "total_tokens": a.Prompt + a.Output}
	created := time.Now().Unix()
	if !stream {
		b, _ := wire.Marshal(map[string]any{"id": id, "object": "chat.completion", "created": created, "model": model,
			"choices": []map[string]any{{"index": 0, "message": map[string]any{"role": "assistant", "content": a.Text}, "finish_reason": finish}}, "usage": usage})
		return "application/json", b
	}
	chunk := func(delta map[string]any, reason any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []map[string]any{{"index": 0, "delta": delta, "finish_reason": reason}}}
	}
	var b []byte
	b = wire.AppendEvent(b, "", chunk(map[string]any{"role": "assistant", "content": a.Text}, nil))
	b = wire.AppendEvent(b, "", chunk(map[string]any{}, finish))
	b = wire.AppendEvent(b, "", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": []any{}, "usage": usage})
	b = wire.AppendEvent(b, "", "[DONE]")
	return "text/event-stream", b
}

func modelList(models []json.RawMessage) any {
	return map[string]any{"object": "list", "data": models}
}

// ErrorBody is an error in OpenAI's shape.
func ErrorBody(_ int, typ, msg string) any {
	return map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": nil, "code": typ}}
}

// includeUsage turns stream_options.include_usage on: the engine measures
// from usage. It returns the edit (nil when the client asked already) and
// whether the client did not ask.
func includeUsage(sp *wire.Spliced) (*wire.Edit, bool) {
	opts, ok := sp.Top["stream_options"]
	if !ok {
		return &wire.Edit{Start: sp.End, End: sp.End, Write: func(w *wire.BodyWriter) {
			w.WriteString(`,"stream_options":{"include_usage":true}`)
		}}, true
	}
	o, err := wire.ParseObject(sp.Body[opts.Start:opts.End])
	if err != nil {
		return nil, false
	}
	if v, ok := o.Get("include_usage"); ok && string(bytes.TrimSpace(v)) == "true" {
		return nil, false
	}
	o.Set("include_usage", []byte("true"))
	b, _ := o.MarshalJSON()
	return &wire.Edit{Start: opts.Start, End: opts.End, Write: func(w *wire.BodyWriter) { w.Write(b) }}, true
}

// answer reads only the usage and the choices' finish reasons, not the
// whole answer.
func answer(b []byte) (*chat.Usage, bool) {
	cut := false
	var m [2][]byte // one pass for both
	wire.Members(b, []string{"choices", "usage"}, m[:])
	if choices := m[0]; choices != nil && choices[0] == '[' {
		// Each choice's finish_reason found by its span: the completion's
		// text around it is not decoded.
		jsonspan.Array(choices, 0, func(vs int) (int, error) {
			ve, err := jsonspan.End(choices, vs)
			if err == nil {
				if r, ok := wire.Member(choices[vs:ve], "finish_reason"); ok {
					reason, _ := jsonspan.String(r, 0, len(r))
					cut = cut || reason == "length"
				}
			}
			return ve, err
		})
	}
	if m[1] == nil {
		return nil, cut
	}
	return usageOf(m[1]), cut
}

type streamReader struct{ s Stream }

func (r *streamReader) Add(ev wire.Event, strip bool) bool {
	_ = r.s.Add(ev.Data)
	return strip && usageOnly(ev.Data)
}

func (r *streamReader) Result() (*chat.Usage, bool, bool) {
	resp := r.s.Response()
	return resp.Usage, resp.Cut, r.s.Done()
}

// usageOnly reports whether a chunk is the one include_usage adds: no
// choices, a usage object — read as JSON, whatever the upstream's spacing.
func usageOnly(data []byte) bool {
	if !bytes.Contains(data, []byte(`"usage"`)) || bytes.Contains(data, []byte(`"delta"`)) {
		return false // a content chunk (with include_usage each carries "usage":null): no decoding
	}
	var c struct {
		Choices *[]json.RawMessage `json:"choices"`
		Usage   json.RawMessage    `json:"usage"`
	}
	if json.Unmarshal(data, &c) != nil {
		return false
	}
	return c.Choices != nil && len(*c.Choices) == 0 && len(c.Usage) > 0 && c.Usage[0] == '{'
}

// foldRelay adds text to the end of a tool message's content — a string,
// an array of parts or null — and leaves out the relay message after it.
func foldRelay(body []byte, tool, relay wire.Mark, text string) []wire.Edit {
	var content wire.Span
	_, err := jsonspan.Object(body, tool.Start, func(k []byte, vs int) (int, error) {
		ve, err := jsonspan.End(body, vs)
		if string(k) == "content" {
			content = wire.Span{Start: vs, End: ve}
		}
		return ve, err
	})
	if err != nil || content.End <= content.Start {
		return nil
	}
	var add wire.Edit
	switch v := content.Of(body); {
	case string(v) == "null" || string(v) == `""`:
		add = wire.Edit{Start: content.Start, End: content.End, Write: func(w *wire.BodyWriter) { w.Write(mustJSON(text)) }}
	case v[0] == '"':
		q := mustJSON(" " + text) // inside the string, after a space: without its quotes
		add = wire.Edit{Start: content.End - 1, End: content.End - 1, Write: func(w *wire.BodyWriter) { w.Write(q[1 : len(q)-1]) }}
	case v[0] == '[':
		empty := jsonspan.Skip(v, 1) == len(v)-1
		add = wire.Edit{Start: content.End - 1, End: content.End - 1, Write: func(w *wire.BodyWriter) {
			if !empty {
				w.WriteByte(',')
			}
			WriteText(w, text)
		}}
	default:
		return nil
	}
	return []wire.Edit{add, {Start: tool.End, End: relay.End, Write: func(*wire.BodyWriter) {}}}
}

// TooLong is OpenAI's refusal of a prompt past the window
// (context_length_exceeded), for Chat Completions and Responses alike.
func TooLong(prompt, window int) (string, string) {
	return "context_length_exceeded", fmt.Sprintf("This model's maximum context length is %d tokens. However, your messages resulted in %d tokens. Please reduce the length of the messages.", window, prompt)
}
