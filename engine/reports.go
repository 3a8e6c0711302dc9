package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
)

// ErrUnsupported is wrapped by the refusal of bytes in no accepted format.
var ErrUnsupported = media.ErrUnsupported

// Upload checks and stores one image or document sent on its own: raw
// bytes of the declared media type, or (declared application/json) the
// JSON {"data_url": "data:…"}. The returned Info says what it is.
func (e *Engine) Upload(ctx context.Context, tenant string, data []byte, declared string) (media.Info, error) {
	if declared == "application/json" {
		var j struct {
			DataURL string `json:"data_url"`
		}
		if err := json.Unmarshal(data, &j); err != nil || j.DataURL == "" {
			return media.Info{}, reason.New(reason.Invalid, `JSON body must be {"data_url": "data:image/…;base64,…"}`)
		}
		d, err := media.ParseDataURL(j.DataURL)
		if err != nil {
			return media.Info{}, err
		}
		data, declared = d.Data, d.MediaType
	}
	in, err := e.Check(data, declared)
	if err != nil {
		return media.Info{}, err
	}
	if err := e.Put(ctx, tenant, in, data); err != nil {
		return media.Info{}, err
	}
	return in, nil
}

// Image is a stored image's bytes and the media type they are (sniffed,
// never a client's word).
func (e *Engine) Image(ctx context.Context, tenant string, ref blob.Ref) ([]byte, string, error) {
	data, err := e.Images.Get(ctx, tenant, ref)
	if err != nil {
		return nil, "", fmt.Errorf("image %s: %w", ref, err)
	}
	mt, _, _ := media.Sniff(data)
	return data, mt, nil
}

// Breakdown is what a session's context holds, as GET /v1/sessions/{id}
// reports it.
type Breakdown struct {
	ContextWindow    int  `json:"context_window"`
	Messages         int  `json:"messages"`
	TextTokens       int  `json:"text_tokens"`
	ImageTokens      int  `json:"image_tokens"`
	KeptImages       int  `json:"kept_images"`
	KeptCost         int  `json:"kept_cost"`
	LastPromptTokens int  `json:"last_prompt_tokens"`
	TurnOpen         bool `json:"turn_open"`
	LogEntries       int  `json:"log_entries"`
}

// Published is a session's history as it is shown (relays not kept yet
// left out) and what its context holds: kept images at their measured
// cost, others estimated.
func (e *Engine) Published(snap *session.Snapshot) ([]chat.Message, Breakdown) {
	p := e.Profile(snap.Meta.Settings.Model)
	published := publishable(snap.State.Live)
	counter := tokens.CounterFor(p.Tokenizer)
	b := Breakdown{ContextWindow: p.ContextWindow, Messages: len(published), KeptCost: policy.KeptCost(snap.State.Live),
		LastPromptTokens: snap.State.LastUsage.Prompt, TurnOpen: snap.State.TurnOpen, LogEntries: len(snap.Log)}
	for _, m := range published {
		b.TextTokens += policy.TextTokens(m.Parts, counter)
		chat.Walk(m.Parts, func(part chat.Part, _ int) bool {
			if img, ok := part.(chat.Image); ok {
				if img.Keep == chat.Kept {
					b.KeptImages++
					b.ImageTokens += img.Cost
				} else if n, err := tokens.ImageTokens(p, img.Width, img.Height, img.Detail); err == nil {
					b.ImageTokens += n
				}
			}
			return true
		})
	}
	return published, b
}

func publishable(live []chat.Message) []chat.Message {
	out := make([]chat.Message, 0, len(live))
	for _, m := range live {
		m = m.Clone()
		m.Parts = dropUnkept(m.Parts)
		out = append(out, m)
	}
	return out
}

func dropUnkept(parts []chat.Part) []chat.Part {
	var out []chat.Part
	for _, p := range parts {
		switch p := p.(type) {
		case chat.Image:
			if p.Origin == chat.FromTool && (p.Keep == chat.Trial || p.Keep == chat.Ephemeral) {
				continue
			}
		case chat.ToolResult:
			p.Parts = dropUnkept(p.Parts)
			out = append(out, p)
			continue
		}
		out = append(out, p)
	}
	return out
}

// KeepStatus says whether keeping images can work for a session: vision
// enabled, the engine seeing images, the budget and what is used of it.
type KeepStatus struct {
	VisionEnabled    bool `json:"vision_enabled"`
	EngineSeesImages bool `json:"engine_sees_images"`
	KeepTurnImages   bool `json:"keep_turn_images"`
	MainThread       bool `json:"main_thread"`
	Budget           int  `json:"budget"`
	Used             int  `json:"used"`
	Available        int  `json:"available"`
}

// Keeping is a session's KeepStatus.
func (e *Engine) Keeping(snap *session.Snapshot) KeepStatus {
	p := e.Profile(snap.Meta.Settings.Model)
	k := KeepStatus{VisionEnabled: p.Vision, EngineSeesImages: !snap.State.Keep.EngineBlind,
		KeepTurnImages: snap.Meta.Settings.KeepTurnImages, MainThread: snap.Meta.Thread == chat.Main,
		Used: policy.KeptCost(snap.State.Live)}
	if k.MainThread && k.KeepTurnImages {
		k.Budget = e.Keep.Budget(p.ContextWindow) // nothing can be kept elsewhere
	}
	k.Available = max(k.Budget-k.Used, 0)
	return k
}

// StoreRefusal refuses, before anything is read, an image a session's
// keepimg/store cannot take: a remote or other URL, a malformed ref,
// unreadable base64, bytes that are not an image. It returns the HTTP
// status, the refusal's code and its message; why is "" when the image
// may go on.
func StoreRefusal(url string) (status int, why, msg string) {
	switch {
	case strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://"):
		return http.StatusUnprocessableEntity, "remote_url", "remote URLs are not stored here; send the image inline"
	case strings.HasPrefix(url, RefScheme):
		if _, err := blob.Parse(strings.TrimPrefix(url, RefScheme)); err != nil {
			return http.StatusBadRequest, "bad_ref", "malformed imgctx: ref: " + err.Error()
		}
		return 0, "", ""
	case len(url) >= 5 && strings.EqualFold(url[:5], "data:"):
		d, err := media.ParseDataURL(url)
		if err != nil {
			return http.StatusBadRequest, "unreadable_base64", err.Error()
		}
		if mt, kind, ok := media.Sniff(d.Data); ok && kind != media.KindImage {
			return http.StatusUnsupportedMediaType, "not_an_image", mt + " sent as an image"
		}
		return 0, "", ""
	}
	return http.StatusUnprocessableEntity, "unsupported_url", "only inline data: URLs and imgctx: refs are stored here"
}
