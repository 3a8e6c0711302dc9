package session

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/chat"
)

// sampleExport is a small session as ExportJSONL writes it.
func sampleExport(t testing.TB) []byte {
	at := time.Date(2026, 12, 7, 9, 0, 0, 0, time.UTC)
	msg := chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: "hi"}}}
	snap := Snapshot{
		Meta:  Meta{ID: "s_000000000000000000000001", Tenant: "acme", Thread: chat.Main, Settings: chat.Settings{Model: "gpt-4o"}, Created: at, Updated: at},
		Log:   []Entry{{Seq: 1, At: at, Message: &msg}},
		State: State{Live: []chat.Message{msg}, LastActivity: at},
	}
	var b bytes.Buffer
	if err := ExportJSONL(&b, snap); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// An export is a file a user hands to `imgctx simulate --from`: what
// ExportJSONL never writes is refused with the line it is on, never a
// panic. A session line with its creation time and no update time is read
// as never updated.
func TestImportRefusesWhatExportNeverWrites(t *testing.T) {
	good := string(sampleExport(t))
	lines := strings.SplitAfter(good, "\n")
	session, entry, state := lines[0], lines[1], lines[2]
	for _, c := range []struct{ name, in, want string }{
		{"not JSON", "{\n", "line 1"},
		{"another version", strings.Replace(session, `"version":1`, `"version":9`, 1) + entry + state, "export version 9 not supported"},
		{"an entry without its time", session + `{"type":"entry","seq":1,"body":{}}` + "\n" + state, "line 2: an entry without its time (at)"},
		{"an entry that is not one", session + strings.Replace(entry, `"body":{`, `"body":[{`, 1), "line 2"},
		{"an entry of nothing", session + `{"type":"entry","seq":1,"at":"2026-12-07T09:00:00Z","body":{}}` + "\n" + state, "line 2: decode log entry 1: it holds neither a message nor a compaction"},
		{"a line of no known type", session + `{"type":"note"}` + "\n" + state, `line 2: unexpected "note" line`},
		{"a line after the state", good + entry, `line 4: unexpected "entry" line`},
		{"no state line", session + entry, "export has no state line: truncated"},
		{"a state of another version", session + `{"type":"state","state":{"version":99}}` + "\n", "session state version 99 not supported"},
	} {
		if _, err := ImportJSONL(strings.NewReader(c.in)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", c.name, err, c.want)
		}
	}
	created := `{"type":"session","version":1,"id":"s_1","created":"2026-01-01T00:00:00Z"}` + "\n"
	snap, err := ImportJSONL(strings.NewReader(created + state))
	if err != nil || !snap.Meta.Updated.Equal(snap.Meta.Created) || snap.Meta.Created.IsZero() {
		t.Fatalf("created without updated: %+v, %v", snap.Meta, err)
	}
	back, err := ImportJSONL(strings.NewReader(good))
	if err != nil || len(back.Log) != 1 || len(back.State.Live) != 1 || back.Meta.Settings.Model != "gpt-4o" {
		t.Fatalf("the good export: %+v, %v", back, err)
	}
}

// An export from anywhere: read or refused, never a panic, and what is
// read writes out again.
func FuzzImportJSONL(f *testing.F) {
	good := sampleExport(f)
	f.Add(good)
	f.Add([]byte(`{"type":"session","version":1,"id":"s_1","created":"2026-01-01T00:00:00Z"}` + "\n"))
	f.Add([]byte(`{"type":"session","version":1,"id":"s_1"}` + "\n" + `{"type":"entry","seq":1,"body":{}}` + "\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		snap, err := ImportJSONL(bytes.NewReader(in))
		if err != nil {
			return
		}
		if err := ExportJSONL(&bytes.Buffer{}, snap); err != nil {
			t.Fatalf("an import does not export again: %v", err)
		}
	})
}
