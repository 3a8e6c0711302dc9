package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
)

// A flat upstream takes one prompt string and one flat list of images
// (llama.cpp's /completion, Ollama's /api/generate): a chat client's
// history cannot be sent message by message. The gateway decodes the
// client's request, renders it with policy.BuildReplay (seed
// replayed-history-images: the current message's images first, then the
// history's, newest turn first within the caps, each named by a numbered
// marker in its turn's text, every image left out counted with its
// reason), sends that, and answers in the client's own wire.

// flatAnswer is what a flat upstream answered.
type flatAnswer struct {
	text           string
	cut            bool
	prompt, output int
}

// llamaMarkers caches each llama.cpp server's media marker (GET /props):
// the prompt must hold one per image, and servers choose their own.
var llamaMarkers sync.Map // base URL → string

func llamaMarker(ctx context.Context, c *upstream.Client, h http.Header) string {
	if m, ok := llamaMarkers.Load(c.BaseURL); ok {
		return m.(string)
	}
	marker := "<__media__>" // the documented default, for servers without /props
	if resp, err := c.Send(ctx, upstream.Request{Method: http.MethodGet, Path: "/props", Header: h}); err == nil {
		var p struct {
			MediaMarker string `json:"media_marker"`
		}
		if json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&p) == nil && p.MediaMarker != "" {
			marker = p.MediaMarker
		}
		resp.Body.Close()
	}
	llamaMarkers.Store(c.BaseURL, marker)
	return marker
}

// flatResolver gives BuildReplay a history image it may attach: one stored
// already as it is, one by remote URL fetched (through the SSRF guard) and
// stored only now that it is selected.
type flatResolver struct {
	s      *Server
	tenant string
}

func (f flatResolver) Resolve(ctx context.Context, img chat.Image) (chat.Image, error) {
	if img.Ref.Valid() {
		return img, nil
	}
	data, in, err := f.s.engine.Resolve(ctx, f.tenant, img.URL)
	if err == nil {
		err = f.s.engine.Put(ctx, f.tenant, in, data)
	}
	if err != nil {
		return chat.Image{}, err
	}
	img.URL, img.Ref, img.MediaType, img.Bytes, img.Width, img.Height = "", in.Ref, in.MediaType, in.Bytes, in.Width, in.Height
	return img, nil
}

// flat serves a chat or messages request whose upstream is a flat one. A
// side request (a token count) is answered from imgctx's own estimate of
// the request it would send — flat backends have no such endpoint — and
// says so in X-Imgctx-Token-Count.
func (s *Server) flat(w http.ResponseWriter, r *http.Request, tenant string, d *dialect, body []byte, model string, up *Upstream, record bool) {
	ctx := r.Context()
	sh := d.shape
	var msgs []chat.Message
	var stream bool
	switch d {
	case chatDialect:
		req, err := openai.DecodeRequest(body)
		if err != nil {
			s.fail(w, sh, reason.Wrap(reason.Invalid, "malformed request", err))
			return
		}
		msgs, stream = req.Messages, req.Stream
	case messagesDialect:
		req, err := anthropic.DecodeRequest(body)
		if err != nil {
			s.fail(w, sh, reason.Wrap(reason.Invalid, "malformed request", err))
			return
		}
		msgs, stream = req.Messages, req.Stream
	default:
		s.fail(w, sh, &routeError{http.StatusBadRequest, "invalid_request_error", fmt.Sprintf("upstream %s (%s) serves the chat and messages routes only", up.Name, up.Client.Format)})
		return
	}
	msgs, err := s.ingestInline(ctx, tenant, msgs)
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	system, history, current := splitFlat(msgs)
	profile := s.engine.ProfileWith(model, up.Hints)
	cfg := *s.cfg.Replay
	cfg.Vision = profile.Vision
	rep, err := policy.BuildReplay(ctx, history, current, cfg, flatResolver{s, tenant}, s.log)
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	if !cfg.Vision && len(rep.Images) > 0 {
		// A backend that renders no images gets none, the current
		// message's included; each is counted.
		rep.Counts.Dropped[reason.NoVision] += len(rep.Images)
		rep.Images = nil
	}
	if !record {
		n := tokens.CounterFor(profile.Tokenizer).Count(flatPrompt(system, rep, current, ""))
		for _, a := range rep.Images {
			if t, err := tokens.ImageTokens(profile, a.Image.Width, a.Image.Height, a.Image.Detail); err == nil {
				n += t
			}
		}
		w.Header().Set("X-Imgctx-Token-Count", "estimated")
		replyJSON(w, http.StatusOK, map[string]int{"input_tokens": n})
		return
	}
	for code, n := range rep.Counts.Dropped {
		s.metrics.images.WithLabelValues("not_sent", string(code)).Add(float64(n))
	}
	s.metrics.images.WithLabelValues("sent", "").Add(float64(len(rep.Images)))
	images := make([]string, len(rep.Images))
	for i, a := range rep.Images {
		if images[i], err = s.engine.Base64(ctx, tenant, a.Image.Ref); err != nil {
			s.fail(w, sh, err)
			return
		}
	}
	req := upstream.Request{Query: r.URL.RawQuery, Header: s.forwardHeader(r), APIKey: s.upstreamKey(r, tenant)}
	var out []byte
	switch up.Client.Format {
	case upstream.LlamaCpp:
		req.Path = "/completion"
		if len(images) == 0 {
			out, _ = wire.Marshal(map[string]any{"prompt": flatPrompt(system, rep, current, ""), "stream": false})
			break
		}
		marker := llamaMarker(ctx, up.Client, req.Header)
		out, _ = wire.Marshal(map[string]any{"prompt": map[string]any{"prompt_string": flatPrompt(system, rep, current, marker), "multimodal_data": images}, "stream": false})
	default: // Ollama
		req.Path = "/api/generate"
		g := map[string]any{"model": model, "prompt": flatPrompt(system, rep, current, ""), "stream": false}
		if len(images) > 0 {
			g["images"] = images
		}
		out, _ = wire.Marshal(g)
	}
	req.Body = wire.BodyOf(out)
	resp, err := up.Client.Send(ctx, req)
	if err != nil {
		s.fail(w, sh, err)
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, s.cfg.MaxResponseBytes))
	resp.Body.Close()
	if err != nil {
		s.fail(w, sh, reason.Wrap(reason.Invalid, "upstream: reading the response", err))
		return
	}
	ans, err := readFlat(up.Client.Format, b)
	if err != nil {
		s.fail(w, sh, &routeError{http.StatusBadGateway, "api_error", "upstream " + up.Name + ": " + err.Error()})
		return
	}
	s.metrics.usage(&chat.Usage{Prompt: ans.prompt, Output: ans.output})
	answerFlat(w, d, model, stream, ans)
}

// ingestInline stores the images given inline or by ref; those by remote
// URL wait for BuildReplay to select them.
func (s *Server) ingestInline(ctx context.Context, tenant string, msgs []chat.Message) ([]chat.Message, error) {
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
					img, err := flatResolver{s, tenant}.Resolve(ctx, p)
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

// readFlat reads a flat upstream's answer: llama.cpp's /completion
// (content, stop_type, tokens_evaluated, tokens_predicted), Ollama's
// /api/generate (response, done_reason, prompt_eval_count, eval_count).
func readFlat(format upstream.Format, b []byte) (flatAnswer, error) {
	if format == upstream.LlamaCpp {
		var r struct {
			Content         string `json:"content"`
			StopType        string `json:"stop_type"`
			TokensEvaluated int    `json:"tokens_evaluated"`
			TokensPredicted int    `json:"tokens_predicted"`
		}
		if err := json.Unmarshal(b, &r); err != nil {
			return flatAnswer{}, fmt.Errorf("not a /completion answer: %w", err)
		}
		return flatAnswer{text: r.Content, cut: r.StopType == "limit", prompt: r.TokensEvaluated, output: r.TokensPredicted}, nil
	}
	var r struct {
		Response        string `json:"response"`
		DoneReason      string `json:"done_reason"`
		PromptEvalCount int    `json:"prompt_eval_count"`
		EvalCount       int    `json:"eval_count"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return flatAnswer{}, fmt.Errorf("not an /api/generate answer: %w", err)
	}
	return flatAnswer{text: r.Response, cut: r.DoneReason == "length", prompt: r.PromptEvalCount, output: r.EvalCount}, nil
}

// answerFlat answers in the client's wire: a chat completion or a
// message, as one JSON object or, when the client streams, as that wire's
// events carrying the whole text (the flat request is not streamed).
func answerFlat(w http.ResponseWriter, d *dialect, model string, stream bool, a flatAnswer) {
	id := fmt.Sprintf("imgctx-%d", time.Now().UnixNano())
	if d == messagesDialect {
		stop := "end_turn"
		if a.cut {
			stop = "max_tokens"
		}
		usage := map[string]int{"input_tokens": a.prompt, "output_tokens": a.output}
		if !stream {
			replyJSON(w, http.StatusOK, map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
				"content": []map[string]any{{"type": "text", "text": a.text}}, "stop_reason": stop, "stop_sequence": nil, "usage": usage})
			return
		}
		sse(w, []sseEvent{
			{"message_start", map[string]any{"type": "message_start", "message": map[string]any{"id": id, "type": "message", "role": "assistant", "model": model,
				"content": []any{}, "stop_reason": nil, "stop_sequence": nil, "usage": map[string]int{"input_tokens": a.prompt, "output_tokens": 0}}}},
			{"content_block_start", map[string]any{"type": "content_block_start", "index": 0, "content_block": map[string]any{"type": "text", "text": ""}}},
			{"content_block_delta", map[string]any{"type": "content_block_delta", "index": 0, "delta": map[string]any{"type": "text_delta", "text": a.text}}},
			{"content_block_stop", map[string]any{"type": "content_block_stop", "index": 0}},
			{"message_delta", map[string]any{"type": "message_delta", "delta": map[string]any{"stop_reason": stop, "stop_sequence": nil}, "usage": map[string]int{"output_tokens": a.output}}},
			{"message_stop", map[string]any{"type": "message_stop"}},
		})
		return
	}
	finish := "stop"
	if a.cut {
		finish = "length"
	}
	usage := map[string]int{"prompt_tokens": a.prompt, "completion_tokens": a.output, "total_tokens": a.prompt + a.output}
	created := time.Now().Unix()
	if !stream {
		replyJSON(w, http.StatusOK, map[string]any{"id": id, "object": "chat.completion", "created": created, "model": model,
			"choices": []map[string]any{{"index": 0, "message": map[string]any{"role": "assistant", "content": a.text}, "finish_reason": finish}}, "usage": usage})
		return
	}
	chunk := func(delta map[string]any, reason any) sseEvent {
		return sseEvent{"", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
			"choices": []map[string]any{{"index": 0, "delta": delta, "finish_reason": reason}}}}
	}
	sse(w, []sseEvent{
		chunk(map[string]any{"role": "assistant", "content": a.text}, nil),
		chunk(map[string]any{}, finish),
		{"", map[string]any{"id": id, "object": "chat.completion.chunk", "created": created, "model": model, "choices": []any{}, "usage": usage}},
		{"", "[DONE]"},
	})
}

type sseEvent struct {
	name string
	data any // an object, or a literal string
}

func sse(w http.ResponseWriter, events []sseEvent) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	for _, ev := range events {
		if ev.name != "" {
			fmt.Fprintf(w, "event: %s\n", ev.name)
		}
		data, ok := ev.data.(string)
		if !ok {
			b, _ := wire.Marshal(ev.data)
			data = string(b)
		}
		fmt.Fprintf(w, "data: %s\n\n", data)
	}
}
