package anthropic

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/imgctx/imgctx/wire/wiretest"
)

// A scan resumed from the previous request's gives what a full scan gives,
// compact and pretty-printed.
func TestScanResumesExactly(t *testing.T) {
	for _, name := range []string{"../../testdata/requests/anthropic-agent.json", "testdata/request.json"} {
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
