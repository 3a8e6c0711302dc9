package openai

import (
	"encoding/json"
	"testing"

	"github.com/imgctx/imgctx/wire"
)

// A tool message's content — a string, an array of parts, null or empty —
// takes the relay's markers at its end, and the relay message is left out:
// the body stays valid JSON, every other byte as it came.
func TestFoldRelayWritesTheMarkersIntoTheToolMessage(t *testing.T) {
	const relay = `{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}`
	for _, c := range []struct{ content, want string }{
		{`"taken \"now\""`, `"taken \"now\" [image removed]"`},
		{`[{"type":"text","text":"taken"}]`, `[{"type":"text","text":"taken"},{"type":"text","text":"[image removed]"}]`},
		{`[ ]`, `[ {"type":"text","text":"[image removed]"}]`},
		{`null`, `"[image removed]"`},
		{`""`, `"[image removed]"`},
	} {
		body := `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"shot","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c","content":` + c.content + `}, ` + relay + `,{"role":"assistant","content":"ok"}]}`
		sp, err := Scan([]byte(body), wire.ScanOptions{})
		if err != nil {
			t.Fatal(err)
		}
		edits := Dialect.FoldRelay(sp.Body, sp.Marks[1], sp.Marks[2], "[image removed]")
		if edits == nil {
			t.Fatalf("%s: not folded", c.content)
		}
		out, err := wire.Splice(sp.Body, edits)
		if err != nil {
			t.Fatal(err)
		}
		want := `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":"shot","arguments":"{}"}}]},` +
			`{"role":"tool","tool_call_id":"c","content":` + c.want + `},{"role":"assistant","content":"ok"}]}`
		if got := string(out.Bytes()); got != want {
			t.Fatalf("%s:\n got %s\nwant %s", c.content, got, want)
		}
		if !json.Valid(out.Bytes()) {
			t.Fatalf("%s: not JSON", c.content)
		}
	}
	// A content it cannot add to (a number, say) leaves the relay alone.
	body := `{"model":"m","messages":[{"role":"tool","tool_call_id":"c","content":7},` + relay + `]}`
	sp, err := Scan([]byte(body), wire.ScanOptions{})
	if err == nil && Dialect.FoldRelay(sp.Body, sp.Marks[0], sp.Marks[1], "[image removed]") != nil {
		t.Fatal("a numeric content was folded into")
	}
}
