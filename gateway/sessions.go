package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/wire/openai"
)

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, tenant string) {
	var req struct {
		Model          string      `json:"model"`
		KeepTurnImages *bool       `json:"keep_turn_images"`
		Thread         chat.Thread `json:"thread"`
	}
	body, err := s.readBody(r)
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || req.Model == "" {
		s.fail(w, openaiShape, reason.New(reason.Invalid, `body must be {"model": "…", "keep_turn_images": true}`))
		return
	}
	if req.Thread != "" && req.Thread != chat.Main && req.Thread != chat.Sub {
		s.fail(w, openaiShape, reason.New(reason.Invalid, `thread must be "main" or "sub"`))
		return
	}
	keep := req.KeepTurnImages == nil || *req.KeepTurnImages
	m, err := s.engine.NewSession(r.Context(), tenant, req.Model, keep, req.Thread)
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	replyJSON(w, http.StatusCreated, sessionJSON(m))
}

func sessionJSON(m session.Meta) map[string]any {
	return map[string]any{"id": m.ID, "model": m.Settings.Model, "keep_turn_images": m.Settings.KeepTurnImages,
		"thread": m.Thread, "created": m.Created.Format(time.RFC3339Nano), "updated": m.Updated.Format(time.RFC3339Nano)}
}

// refURL shows a stored image to API clients as "imgctx:sha256-…".
func refURL(img chat.Image) (string, string, string, error) {
	if img.Ref.Valid() {
		return "", "", "imgctx:" + img.Ref.String(), nil
	}
	return "", "", img.URL, nil
}

// turn runs one exchange: {"messages": [OpenAI-format messages]}.
func (s *Server) turn(w http.ResponseWriter, r *http.Request, tenant string) {
	if up := s.engine.Upstream; up != nil && up.BaseURL != "" && !engine.SpeaksSessions(up.Format) {
		writeError(w, openaiShape, http.StatusNotImplemented, "invalid_request_error", fmt.Sprintf(
			"the sessions API calls openai or anthropic upstreams; this gateway's upstream is %s: use its drop-in route, or add an openai or anthropic upstream", up.Format))
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	req, err := openai.DecodeRequest(body)
	if err != nil {
		s.fail(w, openaiShape, reason.Wrap(reason.Invalid, "malformed turn", err))
		return
	}
	res, err := s.engine.Call(r.Context(), tenant, session.ID(r.PathValue("id")), req.Messages)
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	s.metrics.usage(res.Usage)
	msg, _ := openai.EncodeMessage(res.Message, refURL)
	events := make([]map[string]any, 0, len(res.Events))
	for _, e := range res.Events {
		ev := map[string]any{"kind": e.Kind}
		if e.Ref.Valid() {
			ev["ref"] = e.Ref.String()
		}
		if e.Reason != "" {
			ev["reason"] = e.Reason
		}
		if e.Tokens != 0 {
			ev["tokens"] = e.Tokens
		}
		if e.Detail != "" {
			ev["detail"] = e.Detail
		}
		events = append(events, ev)
	}
	replyJSON(w, http.StatusOK, map[string]any{"message": json.RawMessage(msg), "usage": res.Usage, "events": events, "turn_end": res.TurnEnd})
}

// getSession returns the published history (relays not kept yet are left
// out) and the context breakdown.
func (s *Server) getSession(w http.ResponseWriter, r *http.Request, tenant string) {
	snap, err := s.engine.Sessions.Load(r.Context(), tenant, session.ID(r.PathValue("id")))
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	p := s.engine.Profile(snap.Meta.Settings.Model)
	published := publishable(snap.State.Live)
	counter := tokens.CounterFor(p.Tokenizer)
	text, images, kept := 0, 0, 0
	for _, m := range published {
		text += policy.TextTokens(m.Parts, counter)
		chat.Walk(m.Parts, func(part chat.Part, _ int) bool {
			if img, ok := part.(chat.Image); ok {
				if img.Keep == chat.Kept {
					kept++
					images += img.Cost
				} else if n, err := tokens.ImageTokens(p, img.Width, img.Height, img.Detail); err == nil {
					images += n
				}
			}
			return true
		})
	}
	out := sessionJSON(snap.Meta)
	out["messages"] = published
	out["context"] = map[string]any{
		"context_window": p.ContextWindow, "messages": len(published), "text_tokens": text, "image_tokens": images,
		"kept_images": kept, "kept_cost": policy.KeptCost(snap.State.Live), "last_prompt_tokens": snap.State.LastUsage.Prompt,
		"turn_open": snap.State.TurnOpen, "log_entries": len(snap.Log),
	}
	replyJSON(w, http.StatusOK, out)
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

// patchSession changes a session's settings: {"keep_turn_images": false}
// and/or {"model": "…"}. As the seed says of its switch, turning keeping
// off takes effect at the next turn's start (kept images leave then,
// caption and marker kept); the turn in progress goes on as it began. A new
// model is used from the next request.
func (s *Server) patchSession(w http.ResponseWriter, r *http.Request, tenant string) {
	var req struct {
		Model          *string `json:"model"`
		KeepTurnImages *bool   `json:"keep_turn_images"`
	}
	body, err := s.readBody(r)
	if err == nil {
		d := json.NewDecoder(bytes.NewReader(body))
		d.DisallowUnknownFields()
		err = d.Decode(&req)
	}
	if err != nil || (req.Model != nil && (*req.Model == "" || len(*req.Model) > maxModelName)) {
		s.fail(w, openaiShape, reason.New(reason.Invalid, `body must be {"keep_turn_images": true|false, "model": "…"} (either or both)`))
		return
	}
	id := session.ID(r.PathValue("id"))
	snap, err := s.engine.Sessions.Load(r.Context(), tenant, id)
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	st := snap.Meta.Settings
	if req.Model != nil {
		st.Model = *req.Model
	}
	if req.KeepTurnImages != nil {
		st.KeepTurnImages = *req.KeepTurnImages
	}
	m, err := s.engine.Sessions.SetSettings(r.Context(), tenant, id, st)
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	replyJSON(w, http.StatusOK, sessionJSON(m))
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, tenant string) {
	if err := s.engine.Sessions.Delete(r.Context(), tenant, session.ID(r.PathValue("id"))); err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) exportSession(w http.ResponseWriter, r *http.Request, tenant string) {
	snap, err := s.engine.Sessions.Load(r.Context(), tenant, session.ID(r.PathValue("id")))
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Content-Disposition", fmt.Sprintf(`attachment; filename="%s.jsonl"`, snap.Meta.ID))
	if err := session.ExportJSONL(w, snap); err != nil {
		s.log.Error("export", "session", snap.Meta.ID, "err", err)
	}
}

// keepimg reports whether keeping images can work for the session: vision
// enabled, the engine seeing images, the budget and what is used of it.
func (s *Server) keepimg(w http.ResponseWriter, r *http.Request, tenant string) {
	snap, err := s.engine.Sessions.Load(r.Context(), tenant, session.ID(r.PathValue("id")))
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	p := s.engine.Profile(snap.Meta.Settings.Model)
	used := policy.KeptCost(snap.State.Live)
	budget := 0
	if snap.Meta.Thread == chat.Main && snap.Meta.Settings.KeepTurnImages {
		budget = s.engine.Keep.Budget(p.ContextWindow) // nothing can be kept elsewhere
	}
	replyJSON(w, http.StatusOK, map[string]any{
		"vision_enabled": p.Vision, "engine_sees_images": !snap.State.Keep.EngineBlind,
		"keep_turn_images": snap.Meta.Settings.KeepTurnImages, "main_thread": snap.Meta.Thread == chat.Main,
		"budget": budget, "used": used, "available": max(budget-used, 0),
	})
}

// storeRefusal refuses, before anything is read, an image keepimg/store
// cannot take: a remote or other URL, a malformed ref, unreadable base64,
// bytes that are not an image. why is "" when the image may go on.
func storeRefusal(url string) (status int, why, msg string) {
	switch {
	case strings.HasPrefix(url, "http://") || strings.HasPrefix(url, "https://"):
		return http.StatusUnprocessableEntity, "remote_url", "remote URLs are not stored here; send the image inline"
	case strings.HasPrefix(url, engine.RefScheme):
		if _, err := blob.Parse(strings.TrimPrefix(url, engine.RefScheme)); err != nil {
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

// keepimgStore stores the one image a message carries and returns the
// message rewritten by ref, with its weight in bytes; or a refusal with a
// reason: text only, two images, remote or other URL, malformed or unknown
// ref, unreadable base64, not an image, unknown format, too large.
func (s *Server) keepimgStore(w http.ResponseWriter, r *http.Request, tenant string) {
	if _, err := s.engine.Sessions.Load(r.Context(), tenant, session.ID(r.PathValue("id"))); err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.fail(w, openaiShape, err)
		return
	}
	var env struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(body, &env) != nil || len(env.Message) == 0 {
		s.fail(w, openaiShape, reason.New(reason.Invalid, `body must be {"message": {OpenAI-format message}}`))
		return
	}
	req, err := openai.DecodeRequest([]byte(`{"messages":[` + string(env.Message) + `]}`))
	if err != nil {
		s.fail(w, openaiShape, reason.Wrap(reason.Invalid, "unreadable message", err))
		return
	}
	var imgs []chat.Image
	for _, m := range req.Messages {
		imgs = append(imgs, m.Images()...)
	}
	refuse := func(status int, why, msg string) {
		replyJSON(w, status, map[string]any{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": why, "param": nil}, "refused": why})
	}
	if len(imgs) == 0 {
		refuse(http.StatusUnprocessableEntity, "text_only", "the message carries no image")
		return
	}
	if len(imgs) > 1 {
		refuse(http.StatusUnprocessableEntity, "two_images", fmt.Sprintf("the message carries %d images; send exactly one", len(imgs)))
		return
	}
	if status, why, msg := storeRefusal(imgs[0].URL); why != "" {
		refuse(status, why, msg)
		return
	}
	msgs, err := s.engine.Ingest(r.Context(), tenant, req.Messages)
	if err != nil {
		status, why := http.StatusUnsupportedMediaType, "unknown_format"
		switch {
		case errors.Is(err, engine.ErrUnknownRef):
			status, why = http.StatusNotFound, "unknown_ref"
		case reason.Of(err) == reason.TooLarge:
			status, why = http.StatusRequestEntityTooLarge, "too_large"
		}
		refuse(status, why, err.Error())
		return
	}
	img := msgs[0].Images()[0]
	out, _ := openai.EncodeMessage(msgs[0], refURL)
	answer := map[string]any{"message": json.RawMessage(out), "ref": img.Ref.String(), "bytes": img.Bytes}
	if img.Caption != "" {
		answer["caption"] = img.Caption
	}
	replyJSON(w, http.StatusOK, answer)
}
