package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/gemini"
	"github.com/imgctx/imgctx/wire/jsonspan"
	"github.com/imgctx/imgctx/wire/openai"
	"github.com/imgctx/imgctx/wire/responses"
)

// Recorded is one request as a client sent it, replayed byte for byte:
// its breakpoints, system blocks, thinking and unknown blocks are the
// client's. Images are where the wire's own scanner finds them.
type Recorded struct {
	Think  time.Duration // since the request before
	Path   string
	Header http.Header
	Body   []byte
	Images []RecordedImage // its image and document parts, in order
}

// RecordedImage is one image or document part of a recorded body.
type RecordedImage struct {
	Part, Cache wire.Span
	Key         string // the provider's name for its bytes; "" when not inline
	Size        int    // its base64's length
	Tool        bool   // returned by a tool (in a tool result, or the user message relaying one)
	Document    bool
}

// recordedWires are the wires a recording may be in, with the emulated
// provider's family that serves each.
var recordedWires = map[string]struct {
	dialect *wire.Dialect
	family  string
}{
	"anthropic": {anthropic.Dialect, "anthropic"},
	"openai":    {openai.Dialect, "openai"},
	"responses": {responses.Dialect, "openai"},
	"gemini":    {gemini.Dialect, "gemini"},
}

// envelope is a recorded line with more than the body: where it went,
// when, and with which headers (each a string or a list of strings).
type envelope struct {
	Body    json.RawMessage            `json:"body"`
	Path    string                     `json:"path"`
	Time    string                     `json:"time"` // RFC 3339
	Headers map[string]json.RawMessage `json:"headers"`
}

// fromRequests reads request bodies, one a line, each the whole history so
// far as the client sent it: bare, or in an envelope with its path, time
// and headers. Requests are spaced by their recorded times, by think when
// none are recorded.
func fromRequests(data []byte, think time.Duration) (*Workload, error) {
	w := &Workload{Name: "from requests"}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 512<<20)
	distinct := map[string]bool{}
	var last time.Time
	var prevKeys []string
	timed, untimed, streamed := 0, 0, 0
	for line := 1; sc.Scan(); line++ {
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		rec, at, err := readRecorded(text)
		if err != nil {
			return nil, fmt.Errorf("--from line %d: %w", line, err)
		}
		format, model := recordedFormat(rec.Path, rec.Body)
		if format == "" {
			return nil, fmt.Errorf("--from line %d: neither a session export (first line type session) nor a request body of a known wire (Anthropic or OpenAI messages, Responses input, Gemini contents)", line)
		}
		switch {
		case w.Format == "":
			w.Format, w.Model = format, model
		case format != w.Format && !(isChat(format) && isChat(w.Format)):
			return nil, fmt.Errorf("--from line %d: a %s body in a recording of %s bodies", line, format, w.Format)
		case format != w.Format && w.Format == "chat":
			w.Format = format
		}
		if strings.HasSuffix(rec.Path, ":streamGenerateContent") {
			rec.Path = strings.TrimSuffix(rec.Path, ":streamGenerateContent") + ":generateContent"
			streamed++
		}
		switch {
		case at.IsZero():
			untimed++
			if len(w.Recorded) > 0 {
				rec.Think = think
			}
		default:
			timed++
			if !last.IsZero() {
				rec.Think = max(at.Sub(last), 0)
			}
			last = at
		}
		w.Recorded = append(w.Recorded, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(w.Recorded) == 0 {
		return nil, fmt.Errorf("--from: no request in the file")
	}
	if w.Format == "chat" {
		w.Format = "anthropic" // text alone, both wires' shape: read as Messages
	}
	urls := 0
	for i := range w.Recorded {
		rec := &w.Recorded[i]
		n, err := scanRecorded(rec, w.Format)
		if err != nil {
			return nil, fmt.Errorf("--from request %d: %w", i+1, err)
		}
		urls = max(urls, n)
		var keys []string
		for _, im := range rec.Images {
			if im.Key == "" {
				continue
			}
			keys = append(keys, im.Key)
			if !distinct[im.Key] {
				distinct[im.Key] = true
				origin := "user"
				if im.Tool {
					origin = "tool"
				}
				w.Images = append(w.Images, &Image{ID: len(w.Images) + 1, Bytes: im.Size * 3 / 4, Origin: origin})
			}
		}
		// New attachments: what this body holds past the one before.
		if isPrefix(prevKeys, keys) {
			w.Occurrences += len(keys) - len(prevKeys)
		} else {
			w.Occurrences += len(keys)
		}
		prevKeys = keys
	}
	w.Notes = append(w.Notes, fmt.Sprintf("replayed byte for byte: %d %s request bodies (%d with recorded times, %d spaced %s apart); "+
		"each peer acts on the images of the client's bodies only — breakpoints, compaction and everything else are the client's as recorded, "+
		"so peers do not compact themselves, and ref-loop-cached, strip-on-compact, opencode, "+NaiveImgctx+" and imgctx@opencode (which differ from the client or the imgctx row only in those) are not replayed; "+
		"no hindsight frontier (it needs the workload's model, not bytes)", len(w.Recorded), w.Format, timed, untimed, think))
	if urls > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("up to %d image or document parts a request by URL or file id: the emulated provider has no such files "+
			"and fetches nothing, so each is billed as a 1024×1024 image or one page", urls))
	}
	if streamed > 0 {
		w.Notes = append(w.Notes, fmt.Sprintf("%d streamed Gemini requests replayed unstreamed (the emulator answers generateContent)", streamed))
	}
	return w, nil
}

func isChat(format string) bool {
	return format == "chat" || format == "anthropic" || format == "openai"
}

// readRecorded reads one line: a body, or an envelope holding one.
func readRecorded(line []byte) (Recorded, time.Time, error) {
	var env envelope
	if err := json.Unmarshal(line, &env); err != nil {
		return Recorded{}, time.Time{}, err
	}
	if len(env.Body) == 0 || env.Body[0] != '{' {
		return Recorded{Body: slices.Clone(line)}, time.Time{}, nil
	}
	rec := Recorded{Body: slices.Clone(env.Body), Path: env.Path}
	var at time.Time
	if env.Time != "" {
		t, err := time.Parse(time.RFC3339Nano, env.Time)
		if err != nil {
			return Recorded{}, time.Time{}, fmt.Errorf("time: %v", err)
		}
		at = t
	}
	if len(env.Headers) > 0 {
		rec.Header = http.Header{}
		for k, raw := range env.Headers {
			var one string
			var many []string
			switch {
			case json.Unmarshal(raw, &one) == nil:
				rec.Header.Add(k, one)
			case json.Unmarshal(raw, &many) == nil:
				for _, v := range many {
					rec.Header.Add(k, v)
				}
			default:
				return Recorded{}, time.Time{}, fmt.Errorf("header %s: want a string or a list of strings", k)
			}
		}
	}
	return rec, at, nil
}

// recordedFormat names a body's wire from its path, else from its shape;
// "chat" is a messages body either wire reads alike (text only).
func recordedFormat(path string, body []byte) (format, model string) {
	wire.DecodeMember(body, "model", &model)
	switch {
	case strings.HasSuffix(path, "/v1/messages"):
		return "anthropic", model
	case strings.HasSuffix(path, "/chat/completions"):
		return "openai", model
	case strings.HasSuffix(path, "/responses"):
		return "responses", model
	case strings.Contains(path, ":generateContent") || strings.Contains(path, ":streamGenerateContent"):
		m, _, _ := strings.Cut(path[strings.LastIndex(path, "/models/")+len("/models/"):], ":")
		return "gemini", m
	}
	has := func(k string) bool { _, ok := wire.Member(body, k); return ok }
	switch {
	case has("contents"):
		return "gemini", model
	case has("input"):
		return "responses", model
	case !has("messages"):
		return "", model
	case has("system") || bytes.Contains(body, []byte(`"tool_use"`)) || bytes.Contains(body, []byte(`"tool_result"`)) || bytes.Contains(body, []byte(`"source"`)):
		return "anthropic", model
	case bytes.Contains(body, []byte(`"image_url"`)) || bytes.Contains(body, []byte(`"tool_calls"`)) || bytes.Contains(body, []byte(`"role":"tool"`)) ||
		bytes.Contains(body, []byte(`"role":"system"`)) || bytes.Contains(body, []byte(`"role":"developer"`)):
		return "openai", model
	}
	return "chat", model
}

// scanRecorded finds a body's image and document parts with the wire's
// own scanner; it returns how many are by URL or file id (not inline:
// the scanner leaves file ids to the provider, so they are counted by
// name).
func scanRecorded(rec *Recorded, format string) (int, error) {
	sp, err := recordedWires[format].dialect.Scan(rec.Body, wire.ScanOptions{})
	if err != nil {
		return 0, err
	}
	urls := 0
	for _, sl := range sp.Slots {
		im := RecordedImage{Part: sl.Part, Cache: sl.Cache, Document: sl.Kind == "document", Tool: sl.Pos.Nested >= 0}
		if !im.Tool && (chat.RelaysTool(sp.Messages, sl.Pos.Msg) || sl.Pos.Msg < len(sp.Messages) && sp.Messages[sl.Pos.Msg].Role == chat.Tool) {
			im.Tool = true // relayed after a tool message (OpenAI Chat), or beside a functionResponse (Gemini)
		}
		if sl.Via == "base64" {
			data := sl.Data.Of(rec.Body)
			im.Key, im.Size = imageKey(string(data[:min(len(data), 4096)]), len(data)), len(data)
		} else {
			urls++
		}
		rec.Images = append(rec.Images, im)
	}
	urls += bytes.Count(rec.Body, []byte(`"file_id"`)) + bytes.Count(rec.Body, []byte(`"fileData"`))
	return urls, nil
}

func isPrefix(a, b []string) bool { return len(a) <= len(b) && slices.Equal(a, b[:len(a)]) }

// replays reports whether a peer has a row in a byte replay: the ones that
// act on images (and naive, the recording as sent), but a row that only
// judges (judgesOnly).
func (p Peer) replays() bool {
	return p.Name == "naive" || p.Through && !p.judgesOnly() || p.Keep > 0 || p.AtLimit
}

// replay sends each recorded body: as recorded through imgctx, or with the
// peer's image rule applied to it.
func (r *runner) replay(ctx context.Context) ([]stepInfo, error) {
	w := r.cfg.Workload
	wi := recordedWires[w.Format]
	ttl := r.ttl()
	steps := make([]stepInfo, len(w.Recorded))
	seenImage := false
	for i := range w.Recorded {
		rec := &w.Recorded[i]
		r.clock.Advance(rec.Think)
		var shots []string
		for _, im := range rec.Images {
			seenImage = true
			if im.Tool && !im.Document && im.Key != "" {
				shots = append(shots, im.Key)
			}
		}
		path := rec.Path
		if path == "" {
			path = wi.dialect.Path // "" for Gemini, whose path names the model
			if w.Format == "gemini" {
				path = "/v1beta/models/" + r.cfg.Model + ":generateContent"
			}
		}
		h := rec.Header.Clone()
		if h == nil {
			h = http.Header{}
		}
		h.Del("Content-Length")
		if h.Get("Content-Type") == "" {
			h.Set("Content-Type", "application/json")
		}
		if w.Format == "anthropic" && h.Get("Anthropic-Version") == "" {
			h.Set("Anthropic-Version", "2023-06-01")
		}
		h.Set("X-Sim-Kind", "main")
		body := rec.Body
		if !r.through() {
			var err error
			if body, err = r.transform(rec, wi.dialect); err != nil {
				return nil, fmt.Errorf("request %d: %w", i+1, err)
			}
		}
		before := len(r.prov.Bills())
		status, _, err := r.sendBody(ctx, path, h, body)
		if err != nil {
			return nil, err
		}
		info := stepInfo{main: -1, cold: i == 0 || rec.Think > ttl, hasImages: seenImage, recent: shots[max(0, len(shots)-10):], bills: r.billsSince(before)}
		if len(info.bills) == 0 {
			r.refused[fmt.Sprintf("imgctx_%d", status)]++
		} else {
			info.main = len(r.prov.Bills()) - 1
		}
		steps[i] = info
		if r.cfg.Progress != nil {
			r.cfg.Progress(r.policy, i+1, len(w.Recorded))
		}
	}
	return steps, nil
}

// transform applies the peer's image rule to a recorded body, oldest
// images first, as evict does to a transcript. What it removed stays
// removed while the client's history grows; a body that does not extend
// the one before (the client compacted) starts again.
func (r *runner) transform(rec *Recorded, d *wire.Dialect) ([]byte, error) {
	pe := r.peer
	var elig []RecordedImage
	var keys []string
	for _, im := range rec.Images {
		if !im.Document && (im.Tool || !pe.ToolOnly) {
			elig = append(elig, im)
			keys = append(keys, im.Key)
		}
	}
	st := &r.replayed
	if !isPrefix(st.keys, keys) {
		st.removed = 0
	}
	st.keys = keys
	n := len(elig) - st.removed
	why := "chunked"
	switch {
	case pe.AtLimit:
		why = "ceiling"
		if lim := r.cfg.Profile.Limits.MaxImages; lim > 0 && n > lim {
			r.removed[why] += n - pe.Keep
			st.removed += n - pe.Keep
		}
	case pe.Keep > 0:
		if pe.Chunk == 1 {
			why = "newest_n"
		}
		if over := n - pe.Keep; over > 0 {
			over -= over % pe.Chunk
			r.removed[why] += over
			st.removed += over
		}
	}
	k := min(st.removed, len(elig))
	if k == 0 {
		return rec.Body, nil
	}
	edits := removalEdits(rec.Body, elig[:k], pe.Drop, func(w *wire.BodyWriter, im RecordedImage) {
		d.WriteText(w, placeholder, im.Cache.Of(rec.Body))
	})
	out, err := wire.Splice(rec.Body, edits)
	if err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// replayState is what a peer's rule remembers of a replay: the images it
// removed (the oldest ones) from the history the keys name.
type replayState struct {
	keys    []string
	removed int
}

// removalEdits takes parts out of body: each replaced by what text writes,
// or, with drop, removed from its array with one of its commas.
func removalEdits(body []byte, parts []RecordedImage, drop bool, text func(*wire.BodyWriter, RecordedImage)) []wire.Edit {
	var edits []wire.Edit
	chain := -1 // the first edit of the run of dropped elements ending at the last edit
	for _, im := range parts {
		if !drop {
			edits = append(edits, wire.Edit{Start: im.Part.Start, End: im.Part.End, Write: func(w *wire.BodyWriter) { text(w, im) }})
			continue
		}
		e := wire.Edit{Start: im.Part.Start, End: im.Part.End, Write: func(*wire.BodyWriter) {}}
		next := jsonspan.Skip(body, e.End)
		if next < len(body) && body[next] == ',' {
			// The element and the comma after it.
			e.End = jsonspan.Skip(body, next+1)
			if len(edits) == 0 || edits[len(edits)-1].End != e.Start {
				chain = len(edits)
			}
			edits = append(edits, e)
			continue
		}
		// The last element: the comma before the run it ends goes too.
		first := len(edits)
		if first > 0 && edits[first-1].End == e.Start {
			first = chain
		}
		start := e.Start
		if first < len(edits) {
			start = edits[first].Start
		}
		if c := skipBack(body, start); c >= 0 && body[c] == ',' {
			if first < len(edits) {
				edits[first].Start = c
			} else {
				e.Start = c
			}
		}
		edits = append(edits, e)
		chain = -1
	}
	return edits
}

// skipBack returns the index of the last non-space byte before i, -1 if none.
func skipBack(b []byte, i int) int {
	for i--; i >= 0; i-- {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return i
	}
	return -1
}
