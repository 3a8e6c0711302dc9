package chat

import (
	"encoding/json"
	"fmt"

	"github.com/imgctx/imgctx/blob"
)

// partJSON is the union of every part's fields; "type" says which part it is.
// Zero fields are omitted, so decoding restores them as zero: the encoding
// round-trips exactly.
type partJSON struct {
	Type      string     `json:"type"`
	Text      string     `json:"text,omitempty"`
	Ref       blob.Ref   `json:"ref,omitzero"`
	URL       string     `json:"url,omitempty"`
	MediaType string     `json:"media_type,omitempty"`
	Bytes     int64      `json:"bytes,omitempty"`
	Width     int        `json:"width,omitempty"`
	Height    int        `json:"height,omitempty"`
	Detail    string     `json:"detail,omitempty"`
	Origin    Origin     `json:"origin,omitempty"`
	Keep      Keep       `json:"keep,omitempty"`
	Cost      int        `json:"cost,omitempty"`
	Occ       int        `json:"occ,omitempty"`
	Name      string     `json:"name,omitempty"`
	ID        string     `json:"id,omitempty"`
	Arguments string     `json:"arguments,omitempty"`
	CallID    string     `json:"call_id,omitempty"`
	IsError   bool       `json:"is_error,omitempty"`
	Parts     []partJSON `json:"parts,omitempty"`
	From      int        `json:"from,omitempty"`
	To        int        `json:"to,omitempty"`
	Of        string     `json:"of,omitempty"`
	Caption   string     `json:"caption,omitempty"`
	Reason    string     `json:"reason,omitempty"`
	Handle    string     `json:"handle,omitempty"`
	Extra     string     `json:"extra,omitempty"`
	Wire      string     `json:"wire,omitempty"`
	Raw       string     `json:"raw,omitempty"`
	Pages     int        `json:"pages,omitempty"`
}

type messageJSON struct {
	Role  Role                       `json:"role"`
	Parts []partJSON                 `json:"parts"`
	Extra map[string]json.RawMessage `json:"extra,omitempty"`
	Wire  string                     `json:"wire,omitempty"`
}

func encodeParts(ps []Part) []partJSON {
	out := make([]partJSON, 0, len(ps))
	for _, p := range ps {
		j := partJSON{Type: p.Kind()}
		switch p := p.(type) {
		case Text:
			j.Text, j.Extra = p.Text, p.Extra
		case Image:
			j.Ref, j.URL, j.MediaType, j.Bytes = p.Ref, p.URL, p.MediaType, p.Bytes
			j.Width, j.Height, j.Detail, j.Origin = p.Width, p.Height, p.Detail, p.Origin
			j.Caption, j.Keep, j.Cost, j.Occ, j.Extra = p.Caption, p.Keep, p.Cost, p.Occ, p.Extra
		case Document:
			j.Ref, j.URL, j.MediaType, j.Name, j.Text, j.Caption, j.Extra = p.Ref, p.URL, p.MediaType, p.Name, p.Text, p.Caption, p.Extra
			j.Pages = p.Pages
		case ToolCall:
			j.ID, j.Name, j.Arguments, j.Extra = p.ID, p.Name, p.Arguments, p.Extra
		case ToolResult:
			j.CallID, j.Name, j.IsError, j.Extra = p.CallID, p.Name, p.IsError, p.Extra
			j.Parts = encodeParts(p.Parts)
		case Summary:
			j.Text, j.From, j.To = p.Text, p.From, p.To
		case Marker:
			j.Of, j.MediaType, j.Ref, j.Caption, j.Reason, j.Handle = p.Of, p.MediaType, p.Ref, p.Caption, p.Reason, p.Handle
		case Opaque:
			j.Wire, j.Raw = p.Wire, p.Raw
		}
		out = append(out, j)
	}
	return out
}

func decodeParts(js []partJSON, depth int) ([]Part, error) {
	if len(js) == 0 {
		return nil, nil
	}
	out := make([]Part, 0, len(js))
	for i, j := range js {
		var p Part
		switch j.Type {
		case "text":
			p = Text{Text: j.Text, Extra: j.Extra}
		case "image":
			p = Image{Ref: j.Ref, URL: j.URL, MediaType: j.MediaType, Bytes: j.Bytes,
				Width: j.Width, Height: j.Height, Detail: j.Detail, Origin: j.Origin,
				Caption: j.Caption, Keep: j.Keep, Cost: j.Cost, Occ: j.Occ, Extra: j.Extra}
		case "document":
			p = Document{Ref: j.Ref, URL: j.URL, MediaType: j.MediaType, Name: j.Name, Pages: j.Pages, Text: j.Text, Caption: j.Caption, Extra: j.Extra}
		case "tool_call":
			p = ToolCall{ID: j.ID, Name: j.Name, Arguments: j.Arguments, Extra: j.Extra}
		case "tool_result":
			if depth > 0 {
				return nil, fmt.Errorf("part %d: a tool_result cannot nest inside another", i)
			}
			nested, err := decodeParts(j.Parts, depth+1)
			if err != nil {
				return nil, fmt.Errorf("part %d: %w", i, err)
			}
			p = ToolResult{CallID: j.CallID, Name: j.Name, IsError: j.IsError, Parts: nested, Extra: j.Extra}
		case "summary":
			p = Summary{Text: j.Text, From: j.From, To: j.To}
		case "marker":
			p = Marker{Of: j.Of, MediaType: j.MediaType, Ref: j.Ref, Caption: j.Caption, Reason: j.Reason, Handle: j.Handle}
		case "opaque":
			p = Opaque{Wire: j.Wire, Raw: j.Raw}
		default:
			return nil, fmt.Errorf("part %d: unknown part type %q", i, j.Type)
		}
		out = append(out, p)
	}
	return out, nil
}

// MarshalJSON encodes the message with a "type" on each part.
func (m Message) MarshalJSON() ([]byte, error) {
	return json.Marshal(messageJSON{Role: m.Role, Parts: encodeParts(m.Parts), Extra: m.Extra, Wire: m.Wire})
}

// UnmarshalJSON decodes a message written by MarshalJSON; an unknown part
// type is an error (the set of parts is closed).
func (m *Message) UnmarshalJSON(b []byte) error {
	var j messageJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	switch j.Role {
	case System, User, Assistant, Tool:
	default:
		return fmt.Errorf("unknown role %q", j.Role)
	}
	parts, err := decodeParts(j.Parts, 0)
	if err != nil {
		return err
	}
	*m = Message{Role: j.Role, Parts: parts, Extra: j.Extra, Wire: j.Wire}
	return nil
}
