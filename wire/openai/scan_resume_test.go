package openai

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/wiretest"
)

// A scan resumed from the previous request's gives what a full scan gives,
// compact and pretty-printed.
func TestScanResumesExactly(t *testing.T) {
	for _, name := range []string{"../../testdata/requests/openai-agent.json", "testdata/request.json"} {
		body, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		wiretest.CheckResume(t, Scan, body)
		var pretty []byte
		if pretty, err = json.MarshalIndent(json.RawMessage(body), "", "  "); err != nil {
			t.Fatal(err)
		}
		wiretest.CheckResume(t, Scan, pretty)
	}
}

// Refused: a raw control byte in base64 the scan reads in passing — a part
// with no type whose image_url is the slot and whose file member is not, a
// part that is no slot at all — goes upstream as it came, so it is invalid
// JSON there.
func TestScanRefusesInvalidBase64BesideTheSlot(t *testing.T) {
	for _, part := range []string{
		`{"image_url":{"url":"https://example.com/a.png"},"file":{"file_data":"data:a/b;base64,` + "\x00" + `"}}`,
		`{"type":"x","file":{"file_data":"data:a/b;base64,` + "\x00" + `"}}`,
	} {
		body := `{"model":"m","messages":[{"role":"user","content":[` + part + `]}]}`
		if _, err := Scan([]byte(body), wire.ScanOptions{}); err == nil {
			t.Errorf("accepted %q", body)
		}
	}
}
