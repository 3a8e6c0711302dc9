package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/engine"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/wire/openai"
)

func (s *Server) createSession(w http.ResponseWriter, r *http.Request, tenant string) {
	var req struct {
		Model          string      `json:"model"`
		KeepTurnImages *bool       `json:"keep_turn_images"`
		Thread         chat.Thread `json:"thread"`
		Recall         bool        `json:"recall"`
	}
	body, err := s.readBody(r)
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || req.Model == "" {
		s.fail(w, openai.Dialect, reason.New(reason.Invalid, `body must be {"model": "…", "keep_turn_images": true}`))
		return
	}
	if req.Thread != "" && req.Thread != chat.Main && req.Thread != chat.Sub {
		s.fail(w, openai.Dialect, reason.New(reason.Invalid, `thread must be "main" or "sub"`))
		return
	}
	keep := req.KeepTurnImages == nil || *req.KeepTurnImages
	m, err := s.engine.NewSession(r.Context(), tenant, chat.Settings{Model: req.Model, KeepTurnImages: keep, Recall: req.Recall}, req.Thread)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	replyJSON(w, http.StatusCreated, sessionJSON(m))
}

func sessionJSON(m session.Meta) map[string]any {
	return map[string]any{"id": m.ID, "model": m.Settings.Model, "keep_turn_images": m.Settings.KeepTurnImages,
		"recall": m.Settings.Recall, "thread": m.Thread, "created": m.Created.Format(time.RFC3339Nano), "updated": m.Updated.Format(time.RFC3339Nano)}
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
		writeError(w, openai.Dialect, http.StatusNotImplemented, "invalid_request_error", fmt.Sprintf(
			"the sessions API calls openai or anthropic upstreams; this gateway's upstream is %s: use its drop-in route, or add an openai or anthropic upstream", up.Format))
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	req, err := openai.DecodeRequest(body)
	if err != nil {
		s.fail(w, openai.Dialect, reason.Wrap(reason.Invalid, "malformed turn", err))
		return
	}
	rec := record(r.Context(), session.Request{Conversation: r.PathValue("id")})
	res, err := s.engine.CallOnce(r.Context(), tenant, session.ID(r.PathValue("id")), r.Header.Get("Idempotency-Key"), req.Messages)
	if err != nil {
		rec.Error = clip(err.Error())
		s.fail(w, openai.Dialect, err)
		return
	}
	*rec = res.Record
	if len(res.Events) == 1 && res.Events[0].Kind == "replayed" {
		w.Header().Set("Idempotent-Replayed", "true")
	}
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
		if e.Compaction != "" {
			ev["compaction"] = e.Compaction
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
		s.fail(w, openai.Dialect, err)
		return
	}
	published, breakdown := s.engine.Published(&snap)
	out := sessionJSON(snap.Meta)
	out["messages"] = published
	out["context"] = breakdown
	replyJSON(w, http.StatusOK, out)
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
		Recall         *bool   `json:"recall"`
	}
	body, err := s.readBody(r)
	if err == nil {
		d := json.NewDecoder(bytes.NewReader(body))
		d.DisallowUnknownFields()
		err = d.Decode(&req)
	}
	if err != nil || (req.Model != nil && (*req.Model == "" || len(*req.Model) > engine.MaxModelName)) {
		s.fail(w, openai.Dialect, reason.New(reason.Invalid, `body must be {"keep_turn_images": true|false, "model": "…", "recall": true|false} (any of them)`))
		return
	}
	id := session.ID(r.PathValue("id"))
	snap, err := s.engine.Sessions.Load(r.Context(), tenant, id)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	st := snap.Meta.Settings
	if req.Model != nil {
		st.Model = *req.Model
	}
	if req.KeepTurnImages != nil {
		st.KeepTurnImages = *req.KeepTurnImages
	}
	if req.Recall != nil {
		st.Recall = *req.Recall
	}
	m, err := s.engine.Sessions.SetSettings(r.Context(), tenant, id, st)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	replyJSON(w, http.StatusOK, sessionJSON(m))
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request, tenant string) {
	if err := s.engine.Sessions.Delete(r.Context(), tenant, session.ID(r.PathValue("id"))); err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) exportSession(w http.ResponseWriter, r *http.Request, tenant string) {
	snap, err := s.engine.Sessions.Load(r.Context(), tenant, session.ID(r.PathValue("id")))
	if err != nil {
		s.fail(w, openai.Dialect, err)
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
		s.fail(w, openai.Dialect, err)
		return
	}
	replyJSON(w, http.StatusOK, s.engine.Keeping(&snap))
}

// keepimgStore stores the one image a message carries and returns the
// message rewritten by ref, with its weight in bytes; or a refusal with a
// reason: text only, two images, remote or other URL, malformed or unknown
// ref, unreadable base64, not an image, unknown format, too large.
func (s *Server) keepimgStore(w http.ResponseWriter, r *http.Request, tenant string) {
	if _, err := s.engine.Sessions.Load(r.Context(), tenant, session.ID(r.PathValue("id"))); err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	body, err := s.readBody(r)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	var env struct {
		Message json.RawMessage `json:"message"`
	}
	if json.Unmarshal(body, &env) != nil || len(env.Message) == 0 {
		s.fail(w, openai.Dialect, reason.New(reason.Invalid, `body must be {"message": {OpenAI-format message}}`))
		return
	}
	req, err := openai.DecodeRequest([]byte(`{"messages":[` + string(env.Message) + `]}`))
	if err != nil {
		s.fail(w, openai.Dialect, reason.Wrap(reason.Invalid, "unreadable message", err))
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
	if status, why, msg := engine.StoreRefusal(imgs[0].URL); why != "" {
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
