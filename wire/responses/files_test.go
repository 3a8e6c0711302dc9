package responses

import (
	"testing"

	"github.com/imgctx/imgctx/wire"
)

// A file reference replaces the image_url member, the part's other members
// staying as the client sent them.
func TestFilesEditReplacesOnlyTheURL(t *testing.T) {
	in := `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_image","detail":"high","image_url":"data:image/png;base64,AAAA"}]}]}`
	want := `{"model":"gpt-4o","input":[{"role":"user","content":[{"type":"input_image","detail":"high","file_id":"file-1"}]}]}`
	sp, err := Scan([]byte(in), wire.ScanOptions{})
	if err != nil || len(sp.Slots) != 1 {
		t.Fatalf("%v %d slots", err, len(sp.Slots))
	}
	out, err := wire.Splice(sp.Body, []wire.Edit{Files.Edit(sp.Body, sp.Slots[0], wire.File{ID: "file-1"})})
	if err != nil || string(out.Bytes()) != want {
		t.Fatalf("%v\n got %s\nwant %s", err, out.Bytes(), want)
	}
}
