package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
)

// A flat upstream takes one prompt string and one flat list of images
// (wire/flat: llama.cpp's /completion, Ollama's /api/generate): a chat
// client's history cannot be sent message by message. The engine decodes
// the client's request, renders it with policy.BuildReplay (seed
// replayed-history-images: the current message's images first, then the
// history's, newest turn first within the caps, each named by a numbered
// marker in its turn's text, every image left out counted with its
// reason), sends that, and answers in the client's own wire. A side
// request (a token count) is answered from imgctx's own estimate of the
// request it would send — flat backends have no such endpoint — and says
// so in X-Imgctx-Token-Count.
func (e *Engine) flat(ctx context.Context, c ProxyCall, key, model string, route *Route, counts ProxyCounts) (*Proxied, error) {
	d, backend := c.Wire, route.Client.Wire().Flat
	msgs, stream, err := d.DecodeRequest(c.Body)
	if err != nil {
		return nil, reason.Wrap(reason.Invalid, "malformed request", err)
	}
	if msgs, err = e.ingestInline(ctx, c.Tenant, msgs); err != nil {
		return nil, err
	}
	system, history, current := splitFlat(msgs)
	profile := e.ProfileWith(model, route.Hints)
	cfg := policy.DefaultReplay()
	if e.Replay != nil {
		cfg = *e.Replay
	}
	cfg.Vision = profile.Vision
	var recalls []session.Recall
	if c.Recall {
		cfg.Handle = func(img chat.Image, why reason.Code) string {
			m, _ := chat.MarkerFor(img, string(why))
			m.Handle = RecallHandle(key, img.Ref)
			recalls = append(recalls, recallOf(m, key, model, e.now()))
			return m.Handle
		}
	}
	rep, err := policy.BuildReplay(ctx, history, current, cfg, flatResolver{e, c.Tenant}, e.log())
	if err != nil {
		return nil, err
	}
	if len(recalls) > 0 && !c.Side {
		e.recordRecalls(ctx, c.Tenant, key, recalls)
	}
	p := &Proxied{wire: d, Counts: counts, Conversation: key, Model: model, Upstream: route.Name, profile: profile}
	if c.Side {
		n := tokens.CounterFor(profile.Tokenizer).Count(flatPrompt(system, rep, current, ""))
		for _, a := range rep.Images {
			if t, err := tokens.ImageTokens(profile, a.Image.Width, a.Image.Height, a.Image.Detail); err == nil {
				n += t
			}
		}
		p.Reply = jsonReply(map[string]int{"input_tokens": n}, nil)
		p.Reply.Header.Set("X-Imgctx-Token-Count", "estimated")
		return p, nil
	}
	for _, a := range rep.Images {
		t, _ := tokens.ImageTokens(profile, a.Image.Width, a.Image.Height, a.Image.Detail)
		p.flat = append(p.flat, session.ImageFate{Ref: a.Image.Ref, Sent: true, Width: a.Image.Width, Height: a.Image.Height, Tokens: t})
	}
	for code, n := range rep.Counts.Dropped {
		p.Counts.NotSent[code] += n
		for range n {
			p.flat = append(p.flat, session.ImageFate{Reason: code}) // the replay counts them, by reason only
		}
	}
	p.Counts.Sent = len(rep.Images)
	images := make([]string, len(rep.Images))
	for i, a := range rep.Images {
		if images[i], err = e.Base64(ctx, c.Tenant, a.Image.Ref); err != nil {
			return nil, err
		}
	}
	req := c.Upstream
	req.Path = route.Client.Wire().Path
	marker := ""
	if backend.Marked && len(images) > 0 {
		marker = mediaMarker(ctx, route.Client, backend, req.Header)
	}
	out, err := backend.Request(model, flatPrompt(system, rep, current, marker), images)
	if err != nil {
		return nil, err
	}
	req.Body = wire.BodyOf(out)
	resp, err := route.Client.Send(ctx, req)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, responseLimit(c.MaxResponseBytes)))
	resp.Body.Close()
	if err != nil {
		return nil, reason.Wrap(reason.Invalid, "upstream: reading the response", err)
	}
	ans, err := backend.Read(b)
	if err != nil {
		return nil, fmt.Errorf("upstream: %s: %w", route.Name, err)
	}
	ct, body := d.Complete(model, stream, ans)
	p.Reply = &Reply{Status: http.StatusOK, Header: http.Header{"Content-Type": {ct}}, Body: body,
		Usage: &chat.Usage{Prompt: ans.Prompt, Output: ans.Output}}
	if stream {
		p.Reply.Header.Set("Cache-Control", "no-cache")
	}
	return p, nil
}

// mediaMarkers caches each backend server's media marker: the prompt must
// hold one per image, and servers choose their own.
var mediaMarkers sync.Map // base URL → string

func mediaMarker(ctx context.Context, c *upstream.Client, f *wire.Flat, h http.Header) string {
	if m, ok := mediaMarkers.Load(c.BaseURL); ok {
		return m.(string)
	}
	marker := f.DefaultMarker // the documented default, for servers that do not say
	if resp, err := c.Send(ctx, upstream.Request{Method: http.MethodGet, Path: f.MarkerPath, Header: h}); err == nil {
		var p struct {
			MediaMarker string `json:"media_marker"`
		}
		if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&p) == nil && p.MediaMarker != "" {
			marker = p.MediaMarker
		}
		resp.Body.Close()
	}
	mediaMarkers.Store(c.BaseURL, marker)
	return marker
}

// flatResolver gives BuildReplay a history image it may attach: one stored
// already as it is, one by remote URL fetched (through the SSRF guard) and
// stored only now that it is selected.
type flatResolver struct {
	e      *Engine
	tenant string
}

func (f flatResolver) Resolve(ctx context.Context, img chat.Image) (chat.Image, error) {
	if img.Ref.Valid() {
		return img, nil
	}
	data, in, err := f.e.Resolve(ctx, f.tenant, img.URL)
	if err == nil {
		err = f.e.Put(ctx, f.tenant, in, data)
	}
	if err != nil {
		return chat.Image{}, err
	}
	img.URL, img.Ref, img.MediaType, img.Bytes, img.Width, img.Height = "", in.Ref, in.MediaType, in.Bytes, in.Width, in.Height
	return img, nil
}

// ingestInline stores the images given inline or by ref; those by remote
// URL wait for BuildReplay to select them.
func (e *Engine) ingestInline(ctx context.Context, tenant string, msgs []chat.Message) ([]chat.Message, error) {
	out := chat.CloneMessages(msgs)
	var errs []error
	for i := range out {
		var walk func(parts []chat.Part)
		walk = func(parts []chat.Part) {
			for j, p := range parts {
				switch p := p.(type) {
				case chat.Image:
					if p.URL == "" || strings.HasPrefix(p.URL, "http://") || strings.HasPrefix(p.URL, "https://") {
						continue
					}
					img, err := flatResolver{e, tenant}.Resolve(ctx, p)
					errs = append(errs, err)
					parts[j] = img
				case chat.ToolResult:
					walk(p.Parts)
				}
			}
		}
		walk(out[i].Parts)
	}
	return out, errors.Join(errs...)
}

// splitFlat separates the system text, the history and the current
// message (the last one when it is the user's; else an empty one).
func splitFlat(msgs []chat.Message) (system string, history []chat.Message, current chat.Message) {
	var sys []string
	for _, m := range msgs {
		if m.Role == chat.System {
			sys = append(sys, m.TextContent())
		} else {
			history = append(history, m)
		}
	}
	current = chat.Message{Role: chat.User}
	if n := len(history); n > 0 && history[n-1].Role == chat.User {
		current, history = history[n-1], history[:n-1]
	}
	return strings.Join(sys, "\n"), history, current
}

// flatPrompt is the one string: the system text, the replayed history,
// then the current message with its images named by ordinal. With a
// marker (llama.cpp), one marker per attached image stands in order before
// the current text, where the server puts the images.
func flatPrompt(system string, rep policy.Replay, current chat.Message, marker string) string {
	var b strings.Builder
	if system != "" {
		b.WriteString("System: " + system + "\n\n")
	}
	b.WriteString(rep.History)
	b.WriteString("User: ")
	for _, note := range rep.NotAttached {
		b.WriteString(note + " ")
	}
	if len(rep.Images) > 0 {
		b.WriteString("[Attached images:")
		for _, a := range rep.Images {
			fmt.Fprintf(&b, " #%d", a.Ordinal)
			if marker != "" {
				b.WriteString(" " + marker)
			}
		}
		b.WriteString("] ")
	}
	b.WriteString(current.TextContent())
	b.WriteString("\nAssistant:")
	return b.String()
}

// responseLimit is what is read of an answer: the limit, 64 MB when none.
func responseLimit(n int64) int64 {
	if n > 0 {
		return n
	}
	return 64 << 20
}
