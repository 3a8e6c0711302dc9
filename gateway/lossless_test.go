package gateway

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/media"
	"github.com/imgctx/imgctx/tokens"
	"github.com/imgctx/imgctx/upstream"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
)

// corpus is testdata/requests: agent-shaped requests written from the
// providers' API references (thinking blocks with signatures, redacted
// thinking, mid-conversation system and developer messages, server tools,
// a PDF with cache_control, images in tool results, file and audio parts,
// refusal and annotation fields, unknown future block types), each sent
// compact and pretty-printed.
func corpus(t *testing.T) map[string][]byte {
	files, _ := filepath.Glob("../testdata/requests/*.json")
	if len(files) == 0 {
		t.Fatal("no corpus under testdata/requests")
	}
	out := map[string][]byte{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimSuffix(filepath.Base(f), ".json")
		out[name] = b
		var pretty bytes.Buffer
		if err := json.Indent(&pretty, b, "", "  "); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		out[name+"/pretty"] = pretty.Bytes()
	}
	return out
}

func formatOf(name string) (upstream.Format, string) {
	if strings.HasPrefix(name, "anthropic") {
		return upstream.Anthropic, "/v1/messages"
	}
	return upstream.OpenAI, "/v1/chat/completions"
}

func scanAs(t *testing.T, format upstream.Format, body []byte) *wire.Spliced {
	t.Helper()
	scan := openai.Scan
	if format == upstream.Anthropic {
		scan = anthropic.Scan
	}
	sp, err := scan(body, wire.ScanOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sp
}

// Inline images and documents within the budget: the upstream gets the
// client's body byte for byte, and each image or document is stored once,
// with recall off and on.
func TestCorpusPassesThroughByteForByte(t *testing.T) {
	for name, body := range corpus(t) {
		for _, recall := range []string{"off", "on"} {
			t.Run(name+"/recall="+recall, func(t *testing.T) {
				corpusPassesThrough(t, name, body, recall)
			})
		}
	}
}

// corpusPassesThrough sends one corpus body with recall on or off (with
// nothing removed, recall changes no byte either).
func corpusPassesThrough(t *testing.T, name string, body []byte, recall string) {
	format, path := formatOf(name)
	g := newGW(t, format, nil)
	resp, answer := g.do(t, "POST", path, "", body, "X-Imgctx-Recall", recall)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, answer)
	}
	got := g.up.received()
	if len(got) != 1 || !bytes.Equal(got[0], body) {
		t.Fatalf("the upstream body differs from the client's:\n%s", firstDiff(body, got[0]))
	}
	if n := g.stored(t, "default"); n != 2 { // the screenshot and the PDF
		t.Fatalf("stored %d; want the image and the document", n)
	}
}

// The corpus grown request by request, as an agent sends it: each round
// appends messages carrying block types and members imgctx does not
// manage (thinking with a signature, a block type from next year, an
// unknown member) beside a new screenshot. The requests are taken over
// from the ones before them (the engine then extends what it built for
// those) and each still reaches the upstream byte for byte.
func TestAGrowingCorpusPassesThroughByteForByte(t *testing.T) {
	_, b64 := samplePNG(t)
	rounds := map[upstream.Format][]string{
		upstream.Anthropic: {
			`{"role":"assistant","content":[{"type":"thinking","thinking":"look again","signature":"c2lnbmVk"},{"type":"text","text":"Looking."},{"type":"future_block_2027","x":[1,2]}]}`,
			`{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}},{"type":"text","text":"and now?","citations_v9":true}]}`,
		},
		upstream.OpenAI: {
			`{"role":"assistant","content":"Looking.","reasoning_content":"look again","audio":{"id":"a1"}}`,
			`{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AAAA","format":"wav"}},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}},{"type":"text","text":"and now?"}]}`,
		},
	}
	for name, body := range corpus(t) {
		t.Run(name, func(t *testing.T) {
			format, path := formatOf(name)
			g := newGW(t, format, nil)
			marks := scanAs(t, format, body).Marks
			end := marks[len(marks)-1].End // where the messages array closes
			grown := func(n int) []byte {
				var more strings.Builder
				for range n {
					for _, m := range rounds[format] {
						more.WriteString("," + m)
					}
				}
				return []byte(string(body[:end]) + more.String() + string(body[end:]))
			}
			for n := range 4 {
				b := grown(n)
				if resp, answer := g.do(t, "POST", path, "", b); resp.StatusCode != 200 {
					t.Fatalf("round %d: status %d: %s", n, resp.StatusCode, answer)
				}
				got := g.up.received()
				if !bytes.Equal(got[len(got)-1], b) {
					t.Fatalf("round %d: the upstream body differs from the client's:\n%s", n, firstDiff(b, got[len(got)-1]))
				}
			}
			if m := metric(t, g, "imgctx_proxy_messages_total"); !strings.Contains(m, `how="resumed"`) || strings.Contains(m, `how="resumed"} 0`) {
				t.Fatalf("no request was taken over from the previous one: %s", m)
			}
		})
	}
}

// The same requests naming their images and documents by imgctx: ref: the
// upstream body equals the client's outside the managed parts, and each
// managed part carries the exact stored bytes.
func TestCorpusByRefExpandsOnlyManagedParts(t *testing.T) {
	for name, body := range corpus(t) {
		t.Run(name, func(t *testing.T) {
			format, path := formatOf(name)
			g := newGW(t, format, nil)
			if resp, answer := g.do(t, "POST", path, "", body); resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, answer)
			}
			byRef := body
			sp := scanAs(t, format, body)
			for i := len(sp.Slots) - 1; i >= 0; i-- {
				slot := sp.Slots[i]
				b64 := slot.Data.Of(body)
				data, _, err := media.DecodeBase64Bytes(b64)
				if err != nil {
					t.Fatal(err)
				}
				in, err := media.Inspect(data, "", media.Limits{})
				if err != nil {
					t.Fatal(err)
				}
				// Replace the base64 text only: the ref rides where the data was.
				k := bytes.Index(byRef[slot.Source.Start:slot.Source.End], b64) + slot.Source.Start
				byRef = append(append(append([]byte(nil), byRef[:k]...), "imgctx:"+in.Ref.String()...), byRef[k+len(b64):]...)
			}
			if format == upstream.OpenAI {
				byRef = bytes.ReplaceAll(byRef, []byte("data:image/png;base64,imgctx:"), []byte("imgctx:"))
				byRef = bytes.ReplaceAll(byRef, []byte("data:application/pdf;base64,imgctx:"), []byte("imgctx:"))
			}
			if resp, answer := g.do(t, "POST", path, "", byRef); resp.StatusCode != 200 {
				t.Fatalf("by ref: status %d: %s", resp.StatusCode, answer)
			}
			sent := g.up.received()[1]
			in, out := scanAs(t, format, byRef), scanAs(t, format, sent)
			if len(in.Slots) != len(sp.Slots) || len(out.Slots) != len(sp.Slots) {
				t.Fatalf("slots: %d by ref, %d sent; want %d", len(in.Slots), len(out.Slots), len(sp.Slots))
			}
			if a, b := outside(byRef, in.Slots), outside(sent, out.Slots); !bytes.Equal(a, b) {
				t.Fatalf("bytes outside the managed parts changed:\n%s", firstDiff(a, b))
			}
			for i, slot := range out.Slots {
				if got, want := slot.Data.Of(sent), sp.Slots[i].Data.Of(body); !bytes.Equal(got, want) {
					t.Fatalf("slot %d went out as %.60q…, not the stored bytes", i, got)
				}
			}
		})
	}
}

// outside joins what lies outside the slots' sources.
func outside(body []byte, slots []wire.Slot) []byte {
	var out []byte
	last := 0
	for _, s := range slots {
		out = append(append(out, body[last:s.Source.Start]...), '#')
		last = s.Source.End
	}
	return append(out, body[last:]...)
}

func firstDiff(a, b []byte) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	lo := max(0, i-80)
	return "at byte " + itoa(i) + "\nwant …" + string(a[lo:min(len(a), i+80)]) + "\ngot  …" + string(b[lo:min(len(b), i+80)])
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

// An image shrunk to meet a provider rule goes with one note beside it:
// the original and sent sizes and the coordinate scale (a computer-use
// agent clicks in image coordinates). The note is the same on every
// request, so the prefix stays stable.
func TestShrunkImageCarriesAResizeNote(t *testing.T) {
	for _, format := range []upstream.Format{upstream.OpenAI, upstream.Anthropic} {
		t.Run(string(format), func(t *testing.T) {
			g := newGW(t, format, nil)
			edge := tinyProfile
			edge.Name, edge.Match, edge.Limits = "edge", []string{"edge-*"}, tokens.Limits{MaxEdge: 400}
			g.engine.Profiles, _ = tokens.Default().With(edge)
			_, b64 := samplePNG(t)
			body := `{"model":"edge-1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"click the button"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}]}`
			path := "/v1/chat/completions"
			if format == upstream.Anthropic {
				body = `{"model":"edge-1","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"click the button"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]}]}`
				path = "/v1/messages"
			}
			for range 2 {
				if resp, answer := g.do(t, "POST", path, "", []byte(body)); resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, answer)
				}
			}
			got := g.up.received()
			note := `{"type":"text","text":"[imgctx: the image above was resized from 1280x800 to 400x250 to meet the provider's limits; multiply its coordinates by 3.2 to get coordinates in the original]"}]`
			if !bytes.Contains(got[0], []byte(note)) || bytes.Contains(got[0], []byte(b64)) {
				t.Fatalf("no resize note, or the original went:\n%.400s", got[0][len(got[0])-400:])
			}
			if !bytes.Equal(got[0], got[1]) {
				t.Fatal("the shrunk request differs between two identical requests")
			}
		})
	}
}

// Regression (issue "Hardening", item 7): a second copy of a member imgctx
// reads — in another case, or repeated — would reach an upstream whose
// decoder matches keys without case or keeps the last, unchecked. Such a
// body is refused before anything is stored or sent.
func TestSmuggledMembersAreRefused(t *testing.T) {
	ok := `{"role":"user","content":"hi"}`
	metadata := `{"role":"user","content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/latest/meta-data"}}]}`
	for name, c := range map[string]struct {
		format upstream.Format
		body   string
	}{
		"openai Messages":       {upstream.OpenAI, `{"model":"gpt-4o","messages":[` + ok + `],"Messages":[` + metadata + `]}`},
		"openai messages twice": {upstream.OpenAI, `{"model":"gpt-4o","messages":[` + ok + `],"messages":[` + metadata + `]}`},
		"openai Content":        {upstream.OpenAI, `{"model":"gpt-4o","messages":[{"role":"user","content":"hi","Content":[{"type":"image_url","image_url":{"url":"http://169.254.169.254/"}}]}]}`},
		"openai image_url URL":  {upstream.OpenAI, `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://example.com/a.png","URL":"http://169.254.169.254/"}}]}]}`},
		"anthropic Source":      {upstream.Anthropic, `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"x","Source":{"type":"url","url":"http://169.254.169.254/"}}]}]}`},
		"anthropic data twice":  {upstream.Anthropic, `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBORw0KGgo=","data":"iVBORw0KGgoAAAANSUhEUgABhqAAAYagCAIAAAA="}}]}]}`},
		"anthropic Messages":    {upstream.Anthropic, `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[` + ok + `],"MESSAGES":[` + metadata + `]}`},
		"responses Input":       {upstream.OpenAI, `{"model":"gpt-4o","input":"hi","Input":[` + metadata + `]}`},
		"gemini both spellings": {upstream.Gemini, `{"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"image/png","data":"iVBORw0KGgo="},"inline_data":{"mime_type":"image/png","data":"iVBORw0KGgoAAAANSUhEUgABhqAAAYagCAIAAAA="}}]}]}`},
		"gemini mime twice":     {upstream.Gemini, `{"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"image/png","mime_type":"application/pdf","data":"iVBORw0KGgo="}}]}]}`},
		"gemini contents twice": {upstream.Gemini, `{"contents":[{"role":"user","parts":[{"text":"hi"}]}],"contents":[{"role":"user","parts":[{"fileData":{"mimeType":"image/png","fileUri":"http://169.254.169.254/"}}]}]}`},
	} {
		t.Run(name, func(t *testing.T) {
			g := newGW(t, c.format, nil)
			path := "/v1/chat/completions"
			switch {
			case c.format == upstream.Anthropic:
				path = "/v1/messages"
			case c.format == upstream.Gemini:
				path = "/v1beta/models/gemini-2.5-flash:generateContent"
			case strings.HasPrefix(name, "responses"):
				path = "/v1/responses"
			}
			resp, body := g.do(t, "POST", path, "", []byte(c.body))
			if resp.StatusCode != 400 || !bytes.Contains(body, []byte("refused")) {
				t.Fatalf("status %d: %s; want 400 naming the member", resp.StatusCode, body)
			}
			if len(g.up.received()) != 0 || g.stored(t, "default") != 0 {
				t.Fatal("a smuggling body reached the upstream or the store")
			}
		})
	}
}

// An agent re-sends its history with messages appended: the next request
// is read from where it parts from the previous one, and what goes
// upstream is exactly the client's body — the same as without the
// previous request.
func TestAppendedHistoryIsReadFromWhereItParts(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	_, b64 := samplePNG(t)
	history := []string{`{"role":"system","content":"You are an agent."}`,
		`{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:image/png;base64,` + b64 + `"}}]}`,
		`{"role":"assistant","content":"I see a login form."}`}
	body := func(n int) []byte {
		return []byte(`{"model":"gpt-4o","messages":[` + strings.Join(history[:n], ",") + `],"temperature":0}`)
	}
	history = append(history, `{"role":"user","content":"and now?"}`)
	for _, n := range []int{3, 4} {
		if resp, answer := g.do(t, "POST", "/v1/chat/completions", "", body(n)); resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, answer)
		}
	}
	got := g.up.received()
	if !bytes.Equal(got[1], body(4)) {
		t.Fatalf("the upstream got another body:\n%s", firstDiff(body(4), got[1]))
	}
	if m := metric(t, g, "imgctx_proxy_messages_total"); !strings.Contains(m, `how="resumed"} 3`) || !strings.Contains(m, `how="scanned"} 4`) {
		t.Fatalf("messages: %s; want 3 taken over and 3+1 scanned", m)
	}
	if g.stored(t, "default") != 1 {
		t.Fatal("the image was not stored once")
	}
}

// A block of another type holding an image block in its content is the
// provider's: the scanner drops the slot it saw in passing, and the request
// goes through byte for byte (an early cut matched span keys to slots by
// order and failed on it).
func TestImageInsideAnotherBlockTypePassesThrough(t *testing.T) {
	g := newGW(t, upstream.Anthropic, nil)
	_, b64 := samplePNG(t)
	body := []byte(`{"model":"claude-sonnet-4-6","max_tokens":64,"messages":[{"role":"user","content":[` +
		`{"type":"search_result","source":"https://example.com","title":"t","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + b64 + `"}}]},` +
		`{"type":"text","text":"What is this?"}]}]}`)
	for range 2 { // the second is resumed from the first
		resp, out := g.do(t, "POST", "/v1/messages", "", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, out)
		}
	}
	for i, got := range g.up.received() {
		if !bytes.Equal(got, body) {
			t.Fatalf("request %d was not passed byte for byte", i+1)
		}
	}
}

// The Responses and Gemini requests of their scan goldens (reasoning with
// encrypted content, compaction items, item references, file ids; thought
// parts with signatures, snake_case fields, files by URI, audio), compact
// and pretty-printed, reach the upstream byte for byte.
func TestNewWiresPassThroughByteForByte(t *testing.T) {
	_, b64 := samplePNG(t)
	resp := bytes.ReplaceAll(readTestFile(t, "../wire/responses/testdata/request.json"),
		[]byte(`imgctx:sha256-`+strings.Repeat("ab", 32)), []byte("data:image/png;base64,"+b64))
	// Without its compaction item: the images before one are not sent (a
	// test of its own).
	resp = bytes.Replace(resp, []byte(`{"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABcompacted=="}, `), nil, 1)
	gem := readTestFile(t, "../wire/gemini/testdata/request.json")
	for _, c := range []struct {
		name string
		body []byte
		send func(t *testing.T, body []byte) []byte
	}{
		{"responses", resp, func(t *testing.T, body []byte) []byte {
			rig := newResponsesRig(t, 200_000)
			r, err := http.Post(rig.srv.URL+"/v1/responses", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if r.StatusCode != 200 {
				t.Fatalf("status %d", r.StatusCode)
			}
			got, _ := rig.up.last()
			return got
		}},
		{"gemini", gem, func(t *testing.T, body []byte) []byte {
			up, _, _, url := newGeminiRig(t, 200_000, nil)
			r, err := http.Post(url+"/v1beta/models/agent-1:generateContent", "application/json", bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
			if r.StatusCode != 200 {
				t.Fatalf("status %d", r.StatusCode)
			}
			up.mu.Lock()
			defer up.mu.Unlock()
			return up.bodies[len(up.bodies)-1]
		}},
	} {
		var pretty bytes.Buffer
		json.Indent(&pretty, c.body, "", "  ")
		for _, body := range [][]byte{c.body, pretty.Bytes()} {
			t.Run(c.name, func(t *testing.T) {
				if got := c.send(t, body); !bytes.Equal(got, body) {
					t.Fatalf("the upstream body differs:\n%s", firstDiff(body, got))
				}
			})
		}
	}
}

func readTestFile(t *testing.T, name string) []byte {
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A streamed Chat Completions request gets include_usage from imgctx
// (it measures from usage) beside whatever stream options the client set,
// and the usage chunk that adds reaches only a client that asked for it.
func TestStreamOptionsKeepTheClientsAndUsageOnlyIfAsked(t *testing.T) {
	for _, c := range []struct {
		options, upstream string
		usage             bool
	}{
		{``, `"stream_options":{"include_usage":true}`, false},
		{`,"stream_options":{"include_obfuscation":false}`, `"stream_options":{"include_obfuscation":false,"include_usage":true}`, false},
		{`,"stream_options":{"include_usage":false}`, `"stream_options":{"include_usage":true}`, false},
		{`,"stream_options":{"include_usage":true}`, `"stream_options":{"include_usage":true}`, true},
	} {
		g := newGW(t, upstream.OpenAI, nil)
		body := `{"model":"gpt-4o","stream":true` + c.options + `,"messages":[{"role":"user","content":"hi"}]}`
		resp, answer := g.do(t, "POST", "/v1/chat/completions", "", []byte(body))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", c.options, resp.StatusCode, answer)
		}
		if sent := g.up.received()[0]; !bytes.Contains(sent, []byte(c.upstream)) {
			t.Errorf("client options %s: the upstream got %s, want %s in it", c.options, sent, c.upstream)
		}
		if got := bytes.Contains(answer, []byte(`"usage":{"prompt_tokens"`)); got != c.usage || !bytes.Contains(answer, []byte("data: [DONE]")) {
			t.Errorf("client options %s: usage chunk to the client %v, want %v:\n%s", c.options, got, c.usage, answer)
		}
	}
}

// An image may come by URL on every wire: an imgctx: ref goes up as the
// stored bytes in the wire's inline form (docs/api.md "Naming a stored
// image by ref"), and so does an http(s) URL imgctx fetches (docs/api.md,
// "Images by URL"); a ref the store does not hold answers 404, a URL that
// cannot be fetched 422 fetch_failed, and neither reaches the upstream.
func TestImageURLsOnEveryWire(t *testing.T) {
	raw, b64 := samplePNG(t)
	site := imageSite(t, "/screen.png", raw)
	const ref = "imgctx:sha256-534742a9a0be702e61ca5937b744994707ab2944ffb315b35a959ef1f5173e57"
	for _, w := range []struct {
		name, path string
		format     upstream.Format
		image      func(url string) string
		body       func(images ...string) string
	}{
		{"chat completions", "/v1/chat/completions", upstream.OpenAI,
			func(url string) string { return `{"type":"image_url","image_url":{"url":"` + url + `"}}` },
			func(images ...string) string {
				return `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"compare"},` + strings.Join(images, ",") + `]}]}`
			}},
		{"responses", "/v1/responses", upstream.OpenAI,
			func(url string) string { return `{"type":"input_image","image_url":"` + url + `"}` },
			func(images ...string) string {
				return `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_text","text":"compare"},` + strings.Join(images, ",") + `]}]}`
			}},
		{"anthropic", "/v1/messages", upstream.Anthropic,
			func(url string) string {
				if strings.HasPrefix(url, "data:") {
					return `{"type":"image","source":{"type":"base64","media_type":"image/png","data":"` + strings.TrimPrefix(url, "data:image/png;base64,") + `"}}`
				}
				return `{"type":"image","source":{"type":"url","url":"` + url + `"}}`
			},
			func(images ...string) string {
				return `{"model":"claude-sonnet-4-6","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"compare"},` + strings.Join(images, ",") + `]}]}`
			}},
	} {
		t.Run(w.name, func(t *testing.T) {
			g := newGW(t, w.format, nil)
			g.engine.Fetcher = &media.Fetcher{Timeout: 2 * time.Second, AllowLoopback: true, AnyPort: true, Log: discardLogger()}
			if resp, body := g.do(t, "POST", "/v1/images", "", raw, "Content-Type", "image/png"); resp.StatusCode != 201 {
				t.Fatalf("%d %s", resp.StatusCode, body)
			}
			if resp, answer := g.do(t, "POST", w.path, "", []byte(w.body(w.image(ref), w.image(site.URL+"/screen.png")))); resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, answer)
			}
			inline := w.image("data:image/png;base64," + b64)
			if got, want := g.up.received()[0], []byte(w.body(inline, inline)); !bytes.Equal(got, want) {
				t.Fatalf("upstream body:\n%s", firstDiff(want, got))
			}
			for _, c := range []struct {
				url    string
				status int
			}{
				{strings.Replace(ref, "534742a9", "00000000", 1), 404},
				{site.URL + "/gone.png", 422},
			} {
				if resp, answer := g.do(t, "POST", w.path, "", []byte(w.body(w.image(c.url)))); resp.StatusCode != c.status {
					t.Errorf("%s: %d %s; want %d", c.url, resp.StatusCode, answer, c.status)
				}
			}
			if n := len(g.up.received()); n != 1 {
				t.Fatalf("%d requests reached the upstream; want the first alone", n)
			}
		})
	}
}
