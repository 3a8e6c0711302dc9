package gemini

import (
	"testing"

	"github.com/imgctx/imgctx/wire"
)

// A file reference replaces the inline data member in the client's own
// spelling, and nothing else of the part.
func TestFilesEditKeepsTheSpellingAndThePart(t *testing.T) {
	for in, want := range map[string]string{
		`{"contents":[{"role":"user","parts":[{"inlineData":{"mimeType":"image/png","data":"AAAA"},"mediaResolution":"high"}]}]}`: `{"contents":[{"role":"user","parts":[{"fileData":{"mimeType":"image/png","fileUri":"https://g/files/1"},"mediaResolution":"high"}]}]}`,
		`{"contents":[{"role":"user","parts":[{"inline_data" : {"mime_type":"image/png","data":"AAAA"}}]}]}`:                      `{"contents":[{"role":"user","parts":[{"file_data":{"mime_type":"image/png","file_uri":"https://g/files/1"}}]}]}`,
	} {
		sp, err := Scan([]byte(in), wire.ScanOptions{})
		if err != nil || len(sp.Slots) != 1 {
			t.Fatalf("%s: %v %d slots", in, err, len(sp.Slots))
		}
		out, err := wire.Splice(sp.Body, []wire.Edit{Files.Edit(sp.Body, sp.Slots[0], wire.File{ID: "files/1", URI: "https://g/files/1"})})
		if err != nil || string(out.Bytes()) != want {
			t.Errorf("%v\n got %s\nwant %s", err, out.Bytes(), want)
		}
	}
}
