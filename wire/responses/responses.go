package responses

import (
	"encoding/json"
	"strings"

	"github.com/imgctx/imgctx/chat"
)

type usageJSON struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens int `json:"output_tokens"`
}

type responseJSON struct {
	Status            string `json:"status"`
	IncompleteDetails *struct {
		Reason string `json:"reason"`
	} `json:"incomplete_details"`
	Usage *usageJSON `json:"usage"`
}

func (r responseJSON) read() (*chat.Usage, bool) {
	cut := r.Status == "incomplete" && r.IncompleteDetails != nil && r.IncompleteDetails.Reason == "max_output_tokens"
	if r.Usage == nil {
		return nil, cut
	}
	// input_tokens counts the cached ones too; Responses reports no cache
	// writes.
	return &chat.Usage{Prompt: r.Usage.InputTokens, CacheRead: r.Usage.InputTokensDetails.CachedTokens, Output: r.Usage.OutputTokens}, cut
}

// DecodeResponse reads what the engine needs of a response object: its
// usage (nil when it has none) and whether the output was cut by
// max_output_tokens.
func DecodeResponse(b []byte) (*chat.Usage, bool, error) {
	var r responseJSON
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, false, err
	}
	u, cut := r.read()
	return u, cut, nil
}

// Stream reads a response's server-sent events as they pass: the final one
// (response.completed, response.incomplete or response.failed) carries the
// response object with its usage.
type Stream struct {
	usage *chat.Usage
	cut   bool
	done  bool
}

// Add takes one event's data.
func (s *Stream) Add(data []byte) {
	var ev struct {
		Type     string        `json:"type"`
		Response *responseJSON `json:"response"`
	}
	if json.Unmarshal(data, &ev) != nil || ev.Response == nil {
		return
	}
	switch ev.Type {
	case "response.completed", "response.incomplete", "response.failed":
		s.usage, s.cut = ev.Response.read()
		s.done = true
	}
}

// Done reports whether the final event came.
func (s *Stream) Done() bool { return s.done }

// Usage is the final event's usage and whether the output was cut.
func (s *Stream) Usage() (*chat.Usage, bool) { return s.usage, s.cut }

// DecodeItem reads what an input item bills as text — its text parts, a
// function call's name and arguments, a tool output given as a string —
// for the engine to subtract from a measurement. Images and files are left
// out (they are measured); opaque items (reasoning, compaction) count
// nothing, since their billing is the provider's to say.
func DecodeItem(raw []byte) ([]chat.Message, error) {
	var it struct {
		Role      string          `json:"role"`
		Name      string          `json:"name"`
		Arguments string          `json:"arguments"`
		Content   json.RawMessage `json:"content"`
		Output    json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(raw, &it); err != nil {
		return nil, err
	}
	var text []string
	for _, s := range []string{it.Name, it.Arguments} {
		if s != "" {
			text = append(text, s)
		}
	}
	for _, v := range []json.RawMessage{it.Content, it.Output} {
		var s string
		if json.Unmarshal(v, &s) == nil {
			text = append(text, s)
			continue
		}
		var parts []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}
		if json.Unmarshal(v, &parts) == nil {
			for _, p := range parts {
				if p.Type == "input_text" || p.Type == "output_text" {
					text = append(text, p.Text)
				}
			}
		}
	}
	return []chat.Message{{Role: chat.Role(it.Role), Parts: []chat.Part{chat.Text{Text: strings.Join(text, "\n")}}}}, nil
}
