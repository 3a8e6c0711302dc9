package engine

import (
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
)

// A removal batch breaks the cached prefix from its first marker on:
// images from there may switch to file ids; an earlier removal (one the
// conversation made before) moves nothing.
func TestFilesFromFollowsThisRequestsFirstRemoval(t *testing.T) {
	a, b, c := blob.Of([]byte("a")), blob.Of([]byte("b")), blob.Of([]byte("c"))
	msgs := []chat.Message{
		{Role: chat.User, Parts: []chat.Part{chat.Marker{Of: "image", Ref: a, Reason: "budget"}}}, // removed before
		{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: "ok"}}},
		{Role: chat.User, Parts: []chat.Part{chat.ToolResult{Parts: []chat.Part{chat.Marker{Of: "image", Ref: b, Reason: "window"}}}}},
		{Role: chat.User, Parts: []chat.Part{chat.Image{Ref: c}}},
	}
	f := &proxyTurn{Messages: msgs, filesFrom: 3}
	if got := f.FilesFrom(); got != 3 {
		t.Fatalf("no removal this request: %d, want 3", got)
	}
	f.Events = []Event{{Kind: "removed", Ref: b}, {Kind: "kept", Ref: a}}
	if got := f.FilesFrom(); got != 2 {
		t.Fatalf("a batch from message 2: %d, want 2", got)
	}
	f.filesFrom = 1
	if got := f.FilesFrom(); got != 1 {
		t.Fatalf("a batch after files_from moves nothing: %d, want 1", got)
	}
}
