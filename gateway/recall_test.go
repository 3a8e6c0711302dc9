package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/recall"
	"github.com/imgctx/imgctx/session"
	"github.com/imgctx/imgctx/upstream"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// handleIn finds the recall handles a body's markers carry (in JSON, the
// quotes around a handle are escaped).
var handleIn = regexp.MustCompile(`imgctx_recall\(\\"(i[a-z2-7]{11})\\"\)`)

func handles(body []byte) []string {
	var out []string
	for _, m := range handleIn.FindAllSubmatch(body, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

// removeOne runs the conversation of TestProxyEphemeralBecomesAMarkerNextTurn
// up to its fourth request, whose marker stands for the first screenshot.
func removeOne(g *agent) {
	g.start()
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{tools: 1})
	g.results(1, false, false)
	g.send(reply{})
	g.human("And now?")
	g.send(reply{})
}

// withKey sends an API key on every request of an HTTP client.
type withKey struct{ key string }

func (k withKey) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if k.key != "" {
		r.Header.Set("Authorization", "Bearer "+k.key)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mcpClient connects the official MCP Go SDK's client to the gateway's
// /mcp with an API key.
func mcpClient(t *testing.T, url, key string) (*mcp.ClientSession, error) {
	c := mcp.NewClient(&mcp.Implementation{Name: "imgctx-test", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp",
		HTTPClient: &http.Client{Transport: withKey{key}}, MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, err
}

func callTool(t *testing.T, cs *mcp.ClientSession, name, handle string) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{"handle": handle}})
	if err != nil {
		t.Fatalf("%s(%q): %v", name, handle, err)
	}
	return res
}

func toolText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// With recall on, a removed screenshot's marker carries a handle that
// stays the same at every request; the SDK's MCP client gets the image
// back byte for byte from /mcp with the tenant's key, lists it, and is
// refused for an unknown handle, another tenant's key or none; the image
// the agent then relays in a tool result is sent, measured and budgeted
// like any tool image, appended after an unchanged prefix.
func TestRecallGivesARemovedImageBackOverMCP(t *testing.T) {
	rig := newAgentRig(t, 20_000, &session.Mem{}) // budget 2,000: one screenshot
	rig.recall, rig.keys = true, map[string]string{"key-a": "alpha", "key-b": "beta"}
	rig.restart(t)
	g := newAgent(t, rig, "Open the login page.")
	g.header["x-api-key"] = "key-a"
	removeOne(g)
	hs := handles(g.sent[3])
	if len(hs) != 1 || !bytes.Contains(g.sent[3], []byte(`[image removed — recall with imgctx_recall(\"`+hs[0]+`\")]`)) {
		t.Fatalf("handles in the marker: %q", hs)
	}
	g.human("Once more.")
	g.send(reply{})
	if !bytes.HasPrefix(g.sent[4], g.sent[3][:len(g.sent[3])-2]) {
		t.Fatal("the marker's text changed between requests: the cached prefix broke")
	}

	cs, err := mcpClient(t, rig.srv.URL, "key-a")
	if err != nil {
		t.Fatal(err)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tl := range tools.Tools {
		names = append(names, tl.Name)
	}
	if slices.Sort(names); !slices.Equal(names, []string{recall.ListTool, chat.RecallTool}) {
		t.Fatalf("tools %v", names)
	}
	res := callTool(t, cs, chat.RecallTool, hs[0])
	var got *mcp.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			got = ic
		}
	}
	var removed []blob.Ref
	for _, d := range g.decisionsOf("alpha").Images {
		if d.Keep == chat.Removed {
			removed = append(removed, d.Ref)
		}
	}
	// The second screenshot: the first is the one the budget keeps.
	if res.IsError || got == nil || got.MIMEType != "image/png" || len(removed) != 1 || !removed[0].Matches(got.Data) || !bytes.Equal(got.Data, distinctPNG(g.png, 2)) {
		t.Fatalf("recall: error %v, %q; the removed screenshot back byte for byte: %v", res.IsError, toolText(res), got != nil && bytes.Equal(got.Data, distinctPNG(g.png, 2)))
	}
	if !strings.Contains(toolText(res), "budget") {
		t.Fatalf("recall says %q; want why it was removed", toolText(res))
	}
	list := callTool(t, cs, recall.ListTool, hs[0])
	var listed recall.ListResult
	b, _ := json.Marshal(list.StructuredContent)
	if err := json.Unmarshal(b, &listed); err != nil || list.IsError || len(listed.Images) != 1 ||
		listed.Images[0].Handle != hs[0] || listed.Images[0].Reason != "budget" || listed.Images[0].MediaType != "image/png" {
		t.Fatalf("list: %v %s", err, b)
	}
	for _, bad := range []string{"iaaaaaaaaaaa", "../../etc/passwd", "", strings.Repeat("i", 5000)} {
		if res := callTool(t, cs, chat.RecallTool, bad); !res.IsError || !strings.Contains(toolText(res), "handle") {
			t.Fatalf("recall(%.20q): error %v, %q", bad, res.IsError, toolText(res))
		}
	}
	other, err := mcpClient(t, rig.srv.URL, "key-b")
	if err != nil {
		t.Fatal(err)
	}
	if res := callTool(t, other, chat.RecallTool, hs[0]); !res.IsError || !strings.Contains(toolText(res), "unknown recall handle") {
		t.Fatalf("another tenant recalled alpha's image: %q", toolText(res))
	}
	if res := callTool(t, other, recall.ListTool, hs[0]); !res.IsError {
		t.Fatalf("another tenant listed alpha's images: %q", toolText(res))
	}
	if _, err := mcpClient(t, rig.srv.URL, ""); err == nil {
		t.Fatal("an MCP client without a key connected")
	}
	if _, err := mcpClient(t, rig.srv.URL, "key-c"); err == nil {
		t.Fatal("an MCP client with an unknown key connected")
	}

	// The model calls the tool; the agent relays its image in a tool
	// result, as it relays any tool image.
	g.send(reply{tools: 1})
	id := g.pending[0]
	g.msgs = append(g.msgs, `{"role":"user","content":[{"type":"tool_result","tool_use_id":"`+id+`","content":[`+
		`{"type":"text","text":"`+toolText(res)+`"},`+
		`{"type":"image","source":{"type":"base64","media_type":"image/png","data":"`+base64.StdEncoding.EncodeToString(got.Data)+`"}}]}]}`)
	g.send(reply{})
	last := g.sent[len(g.sent)-1]
	prev := g.sent[len(g.sent)-2]
	if !bytes.HasPrefix(last, prev[:len(prev)-2]) {
		t.Fatal("the recalled image was not appended after an unchanged prefix")
	}
	if countImages(last) != countImages(prev)+1 || !bytes.Contains(last[len(prev)-2:], []byte(base64.StdEncoding.EncodeToString(got.Data))) {
		t.Fatalf("the recalled image was not sent in its tool result: %d images, %d before", countImages(last), countImages(prev))
	}
	found := false
	for _, d := range g.decisionsOf("alpha").Images {
		if d.Ref.Matches(got.Data) && d.Msg == len(g.msgs)-2 && d.Keep != "" {
			found = true
		}
	}
	if !found {
		t.Fatalf("no decision for the recalled image in its tool result: %+v", g.decisionsOf("alpha").Images)
	}
	g.human("Thanks.")
	g.send(reply{})
	if n := len(handles(g.sent[len(g.sent)-1])); n != 2 {
		// Over the budget of one screenshot, the recalled one leaves again
		// by the same rule, with the same handle as before.
		t.Fatalf("%d markers with handles after the recalled image's turn; want 2 (%q)", n, handles(g.sent[len(g.sent)-1]))
	}
}

// A handle belongs to one conversation: the same screenshots in another
// conversation get other handles, and listing by one shows only its own;
// with recall off (the default, or X-Imgctx-Recall: off) markers say
// nothing of it.
func TestRecallHandlesAreConversationScopedAndOffByDefault(t *testing.T) {
	rig := newAgentRig(t, 20_000, &session.Mem{})
	rig.recall = true
	rig.restart(t)
	a, b := newAgent(t, rig, "Open the login page."), newAgent(t, rig, "Open the settings page.")
	removeOne(a)
	removeOne(b)
	ha, hb := handles(a.sent[3]), handles(b.sent[3])
	if len(ha) != 1 || len(hb) != 1 || ha[0] == hb[0] {
		t.Fatalf("the same image in two conversations: handles %q and %q", ha, hb)
	}
	cs, err := mcpClient(t, rig.srv.URL, "")
	if err != nil {
		t.Fatal(err)
	}
	var listed recall.ListResult
	res := callTool(t, cs, recall.ListTool, hb[0])
	buf, _ := json.Marshal(res.StructuredContent)
	if json.Unmarshal(buf, &listed); len(listed.Images) != 1 || listed.Images[0].Handle != hb[0] {
		t.Fatalf("conversation b lists %s", buf)
	}

	off := newAgent(t, rig, "Open the help page.")
	off.header["X-Imgctx-Recall"] = "off"
	removeOne(off)
	if len(handles(off.sent[3])) != 0 || !bytes.Contains(off.sent[3], []byte(`[image removed]`)) {
		t.Fatal("X-Imgctx-Recall: off still gave a handle")
	}
	rig.recall = false
	rig.restart(t)
	def := newAgent(t, rig, "Open the about page.")
	removeOne(def)
	if len(handles(def.sent[3])) != 0 || !bytes.Contains(def.sent[3], []byte(`[image removed]`)) {
		t.Fatal("recall off by default still gave a handle")
	}
	on := newAgent(t, rig, "Open the news page.")
	on.header["X-Imgctx-Recall"] = "on"
	removeOne(on)
	if len(handles(on.sent[3])) != 1 {
		t.Fatal("X-Imgctx-Recall: on gave no handle")
	}
}

// A session created with "recall": true says so, offers the model the
// recall tool at each request, and stops when PATCH turns it off.
func TestSessionsAPIRecallSetting(t *testing.T) {
	g := newGW(t, upstream.OpenAI, nil)
	resp, body := g.do(t, "POST", "/v1/sessions", "", []byte(`{"model":"gpt-4o","recall":true}`))
	if resp.StatusCode != 201 || decodeJSON(t, body)["recall"] != true {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	id := decodeJSON(t, body)["id"].(string)
	if _, body := g.do(t, "GET", "/v1/sessions/"+id, "", nil); decodeJSON(t, body)["recall"] != true {
		t.Fatalf("get: %s", body)
	}
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"Hello."}]}`))
	got := g.up.received()
	if !bytes.Contains(got[len(got)-1], []byte(`"tools":[{"type":"function","function":{"name":"imgctx_recall"`)) {
		t.Fatalf("the recall tool was not offered: %s", got[len(got)-1])
	}
	if resp, body := g.do(t, "PATCH", "/v1/sessions/"+id, "", []byte(`{"recall":false}`)); resp.StatusCode != 200 || decodeJSON(t, body)["recall"] != false {
		t.Fatalf("patch: %d %s", resp.StatusCode, body)
	}
	g.do(t, "POST", "/v1/sessions/"+id+"/turn", "", []byte(`{"messages":[{"role":"user","content":"Again."}]}`))
	got = g.up.received()
	if bytes.Contains(got[len(got)-1], []byte(chat.RecallTool)) {
		t.Fatal("the recall tool was still offered after PATCH turned it off")
	}
}

// On a flat backend (llama.cpp) the replay's notes for history images
// not attached name their handles too, and the MCP server answers them.
func TestRecallNamesTheFlatReplaysNotes(t *testing.T) {
	r := newFlatRig(t, upstream.LlamaCpp, nil, nil)
	r.recall(t)
	r.chat(t, r.history(6)...)
	prompt, _, _ := r.up.last()
	hs := regexp.MustCompile(`\(cap\) — recall with imgctx_recall\("(i[a-z2-7]{11})"\)\]`).FindAllStringSubmatch(prompt, -1)
	if len(hs) != 2 {
		t.Fatalf("%d notes with handles:\n%s", len(hs), prompt)
	}
	cs, err := mcpClient(t, r.url, "")
	if err != nil {
		t.Fatal(err)
	}
	res := callTool(t, cs, chat.RecallTool, hs[0][1])
	var got []byte
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			got = ic.Data
		}
	}
	if res.IsError || !bytes.Equal(got, distinctPNG(r.png, 1)) {
		t.Fatalf("recall of the oldest screen: %v %q", res.IsError, toolText(res))
	}
	r.chat(t, r.history(6)...)
	again, _, _ := r.up.last()
	if again != prompt {
		t.Fatal("a rebuilt replay named other handles")
	}
}
