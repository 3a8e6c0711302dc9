package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
)

// FromFile reads a recorded session as a workload: either the sessions
// API's export (JSONL, docs/format.md; images are stored by ref there, so
// each is replayed as a synthetic PNG of its recorded size, which is what
// its tokens depend on), or one request body a line as a proxy sees them
// (each the whole history so far; Anthropic Messages, OpenAI Chat,
// Responses or Gemini), bare or in an envelope with its path, time and
// headers, replayed byte for byte (fromRequests). think is the time
// between two requests when the file does not record it.
func FromFile(r io.Reader, think time.Duration) (*Workload, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	first, _, _ := bytes.Cut(bytes.TrimSpace(data), []byte("\n"))
	var probe struct {
		Type string `json:"type"`
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
	}
	return fromRequests(data, think)
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
