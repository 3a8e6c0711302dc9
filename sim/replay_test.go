package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/wire"
)

// received runs a replay and keeps, by policy, the bodies the emulated
// provider received.
func received(t *testing.T, w *Workload, model string, policies ...string) (*Report, map[string][][]byte) {
	t.Helper()
	prof, ok := tokens.Default().Lookup(model)
	if !ok {
		t.Fatalf("no profile for %s", model)
	}
	var mu sync.Mutex
	got := map[string][][]byte{}
	rep, err := Run(context.Background(), Config{Workload: w, Model: model, Profile: prof, Policies: policies,
		Received: func(policy string, b []byte) {
			mu.Lock()
			got[policy] = append(got[policy], bytes.Clone(b))
			mu.Unlock()
		}})
	if err != nil {
		t.Fatal(err)
	}
	return rep, got
}

func fromLines(t *testing.T, lines ...string) *Workload {
	t.Helper()
	w, err := FromFile(strings.NewReader(strings.Join(lines, "\n")), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// The recorded agent bodies reach the provider through imgctx byte for
// byte when imgctx removes nothing: the client's breakpoints, system
// blocks, thinking, mid-conversation system messages, unknown blocks and
// tool-message images are all there, and every image is counted.
func TestReplayedAgentBodiesReachTheProviderUnchanged(t *testing.T) {
	for _, c := range []struct {
		file, model string
		images      int
	}{
		{"anthropic-agent.json", "claude-sonnet-4-6", 2},
		{"openai-agent.json", "gpt-4o", 2},
	} {
		body, err := os.ReadFile(filepath.Join("..", "testdata", "requests", c.file))
		if err != nil {
			t.Fatal(err)
		}
		body = bytes.TrimSpace(body)
		w := fromLines(t, string(body))
		if len(w.Recorded) != 1 || len(w.Images) != c.images {
			t.Fatalf("%s: %d requests, %d images; want 1 and %d", c.file, len(w.Recorded), len(w.Images), c.images)
		}
		rep, got := received(t, w, c.model, "naive", "imgctx")
		for _, policy := range []string{"naive", "imgctx"} {
			if len(got[policy]) != 1 || !bytes.Equal(got[policy][0], body) {
				t.Fatalf("%s, %s: the provider received %d bodies, the first not the recorded one", c.file, policy, len(got[policy]))
			}
			if r := row(rep, policy); r.Failed != 0 || r.FinalImages != c.images {
				t.Fatalf("%s, %s: %d failed, %d images sent; want 0 and %d", c.file, policy, r.Failed, r.FinalImages, c.images)
			}
		}
	}
}

// A recording of a growing Anthropic history, in envelopes with times and
// headers: requests are spaced by the recorded times, the client's own
// breakpoints stay, and a peer's rule is applied to the bodies (chunked
// 3/10: nothing removed until 13 tool images, then 10 at once).
func TestReplayAppliesPeersToTheRecordedBodies(t *testing.T) {
	p := small()
	p.ImageKB, p.Turns, p.ImagesPerTurn, p.IdleEvery, p.Same = 0, 4, 5, 0, 0
	gen, err := Build("computer-use", p)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	var lines, bodies []string
	var transcript []Msg
	for i, st := range gen.Steps {
		transcript = append(transcript, st.Add...)
		body := render("anthropic", "claude-sonnet-4-6", gen.System, gen.Tools, transcript, false)
		bodies = append(bodies, string(body))
		lines = append(lines, fmt.Sprintf(`{"path":"/v1/messages","time":%q,"headers":{"anthropic-beta":["a","b"],"x-app":"cli"},"body":%s}`,
			at.Add(time.Duration(i)*7*time.Second).Format(time.RFC3339), body))
	}
	w := fromLines(t, lines...)
	if w.Format != "anthropic" || w.Model != "claude-sonnet-4-6" || len(w.Recorded) != len(gen.Steps) || w.Recorded[1].Think != 7*time.Second {
		t.Fatalf("read as %s %s, %d requests (think %v)", w.Format, w.Model, len(w.Recorded), w.Recorded[1].Think)
	}
	if h := w.Recorded[0].Header; len(h.Values("Anthropic-Beta")) != 2 || h.Get("X-App") != "cli" {
		t.Fatalf("headers: %v", h)
	}
	rep, got := received(t, w, "claude-sonnet-4-6", "naive", "chunked", "imgctx")
	if rep.Steps != len(gen.Steps) || rep.Frontier != nil || !strings.Contains(strings.Join(rep.Notes, "\n"), "byte for byte") {
		t.Fatalf("report: %d steps, frontier %v, notes %q", rep.Steps, rep.Frontier, rep.Notes)
	}
	for i, b := range got["naive"] {
		if string(b) != bodies[i] {
			t.Fatalf("naive: request %d is not the recorded body", i+1)
		}
	}
	if bytes.Count(got["imgctx"][0], []byte(`"cache_control"`)) != strings.Count(bodies[0], `"cache_control"`) {
		t.Fatal("imgctx: the client's breakpoints did not reach the provider")
	}
	shots := 0
	for i, b := range got["chunked-3/10"] {
		tool := toolImages(t, bodies[i])
		want := tool
		if tool >= 13 {
			want = tool - (tool-3)/10*10
		}
		if n := toolImages(t, string(b)); n != want {
			t.Fatalf("chunked-3/10, request %d: %d tool images sent of %d recorded; want %d", i+1, n, tool, want)
		}
		if strings.Count(string(b), `"cache_control"`) != strings.Count(bodies[i], `"cache_control"`) {
			t.Fatalf("chunked-3/10, request %d: breakpoints changed", i+1)
		}
		shots = tool
	}
	if shots < 13 {
		t.Fatalf("the recording reaches %d tool images: it does not exercise a removal", shots)
	}
	if r := row(rep, "chunked-3/10"); r.Removed["chunked"] != (shots-3)/10*10 {
		t.Fatalf("chunked-3/10 counts %v removed", r.Removed)
	}
}

// toolImages counts the images inside tool results of an Anthropic body.
func toolImages(t *testing.T, body string) int {
	t.Helper()
	var req struct {
		Messages []struct {
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal([]byte(body), &req); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range req.Messages {
		var blocks []struct {
			Type    string `json:"type"`
			Content []struct {
				Type string `json:"type"`
			} `json:"content"`
		}
		json.Unmarshal(m.Content, &blocks)
		for _, b := range blocks {
			for _, in := range b.Content {
				if b.Type == "tool_result" && in.Type == "image" {
					n++
				}
			}
		}
	}
	return n
}

// Responses and Gemini recordings replay too: the emulated provider reads
// their images (a Responses function_call_output's input_image, a Gemini
// functionResponse's inlineData) and bills them.
func TestReplayResponsesAndGemini(t *testing.T) {
	png := pngBase64(t, 640, 400)
	responses := []string{
		`{"model":"gpt-4o","instructions":"You drive a browser.","input":[{"role":"user","content":"Open the page."}]}`,
		`{"model":"gpt-4o","instructions":"You drive a browser.","input":[{"role":"user","content":"Open the page."},` +
			`{"type":"function_call","call_id":"c1","name":"screenshot","arguments":"{}"},` +
			`{"type":"function_call_output","call_id":"c1","output":[{"type":"input_image","image_url":"data:image/png;base64,` + png + `"}]}]}`,
	}
	w := fromLines(t, responses...)
	if w.Format != "responses" || len(w.Images) != 1 || !w.Recorded[1].Images[0].Tool {
		t.Fatalf("responses: read as %s with %d images", w.Format, len(w.Images))
	}
	rep, got := received(t, w, "gpt-4o", "naive", "imgctx")
	for _, policy := range []string{"naive", "imgctx"} {
		r := row(rep, policy)
		if r.Failed != 0 || r.FinalImages != 1 || r.Input+r.CacheRead == 0 {
			t.Fatalf("responses, %s: %+v", policy, r)
		}
		if len(got[policy]) != 2 || string(got[policy][1]) != responses[1] {
			t.Fatalf("responses, %s: the provider did not receive the recorded bodies", policy)
		}
	}
	if _, err := Run(context.Background(), Config{Workload: w, Model: "claude-sonnet-4-6", Profile: sonnet(t)}); err == nil || !strings.Contains(err.Error(), "responses bodies") {
		t.Fatalf("a Responses recording against an Anthropic profile: %v", err)
	}

	gemini := `{"path":"/v1beta/models/gemini-2.5-flash:streamGenerateContent","body":{"contents":[{"role":"user","parts":[{"text":"Look."}]},` +
		`{"role":"model","parts":[{"functionCall":{"name":"screenshot","args":{}}}]},` +
		`{"role":"user","parts":[{"functionResponse":{"name":"screenshot","response":{"ok":true},"parts":[{"inlineData":{"mimeType":"image/png","data":"` + png + `"}}]}}]}]}}`
	w = fromLines(t, gemini)
	if w.Format != "gemini" || w.Model != "gemini-2.5-flash" || len(w.Images) != 1 {
		t.Fatalf("gemini: read as %s %s with %d images", w.Format, w.Model, len(w.Images))
	}
	rep, _ = received(t, w, "gemini-2.5-flash", "naive", "imgctx")
	for _, policy := range []string{"naive", "imgctx"} {
		if r := row(rep, policy); r.Failed != 0 || r.FinalImages != 1 {
			t.Fatalf("gemini, %s: %d failed (%v), %d images", policy, r.Failed, r.FailedBy, r.FinalImages)
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "unstreamed") {
		t.Fatalf("the streamed request's replay is not named: %q", rep.Notes)
	}
}

// Dropped parts leave valid JSON: each goes with one comma, whichever
// side it is on, however many are adjacent.
func TestRemovalEditsDropWithTheirCommas(t *testing.T) {
	body := []byte(`{"a":[ {"i":1}, {"i":2} ,{"i":3},{"i":4} ]}`)
	span := func(n int) RecordedImage {
		s := bytes.Index(body, []byte(fmt.Sprintf(`{"i":%d}`, n)))
		return RecordedImage{Part: wire.Span{Start: s, End: s + 7}}
	}
	for _, c := range []struct {
		drop []int
		want string
	}{
		{[]int{1}, `[ {"i":2} ,{"i":3},{"i":4} ]`},
		{[]int{4}, `[ {"i":1}, {"i":2} ,{"i":3} ]`},
		{[]int{3, 4}, `[ {"i":1}, {"i":2}  ]`},
		{[]int{2, 3}, `[ {"i":1}, {"i":4} ]`},
		{[]int{1, 2, 3, 4}, `[  ]`},
		{[]int{1, 3}, `[ {"i":2} ,{"i":4} ]`},
	} {
		var parts []RecordedImage
		for _, n := range c.drop {
			parts = append(parts, span(n))
		}
		out, err := wire.Splice(body, removalEdits(body, parts, true, nil))
		if err != nil {
			t.Fatal(err)
		}
		got := string(out.Bytes())
		if want := `{"a":` + c.want + `}`; got != want || !json.Valid(out.Bytes()) {
			t.Errorf("drop %v: %s; want %s", c.drop, got, want)
		}
	}
}
