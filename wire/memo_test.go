package wire_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/wire"
	"github.com/imgctx/imgctx/wire/anthropic"
	"github.com/imgctx/imgctx/wire/openai"
	"pgregory.net/rapid"
)

// A session's requests encoded with its memo are the bytes encoded
// without one, whatever changes between them: messages appended, an
// earlier one rewritten (a marker, a summary), breakpoints moved, turns
// with images, the memo reused after a failed or other request.
func TestMemoWritesWhatTheEncoderWrites(t *testing.T) {
	source := func(img chat.Image) (string, string, string, error) {
		return img.MediaType, "aGVsbG8=", "", nil
	}
	for _, d := range []*wire.Dialect{anthropic.Dialect, openai.Dialect} {
		t.Run(d.Name, func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				memo := new(wire.Memo)
				var msgs []chat.Message
				for req := range rapid.IntRange(1, 8).Draw(t, "requests") {
					for range rapid.IntRange(0, 4).Draw(t, "appended") {
						msgs = append(msgs, drawMessage(t, len(msgs)))
					}
					if len(msgs) > 0 && rapid.Bool().Draw(t, "rewrite") {
						msgs[rapid.IntRange(0, len(msgs)-1).Draw(t, "at")] = drawMessage(t, req)
					}
					if len(msgs) == 0 {
						continue
					}
					r := wire.SessionRequest{Model: "m", MaxTokens: 100, Messages: msgs, Source: source}
					for i := range msgs {
						if rapid.IntRange(0, 3).Draw(t, fmt.Sprintf("breakpoint%d", i)) == 0 {
							r.CacheMessages = append(r.CacheMessages, i)
						}
					}
					r.CacheHour = rapid.Bool().Draw(t, "hour")
					plain, err := d.EncodeSession(r)
					if err != nil {
						t.Fatal(err)
					}
					r.Memo = memo
					if rapid.IntRange(0, 3).Draw(t, "failed") == 0 {
						// A request that fails where it reads an image: the
						// turns before it written, the request not Done.
						failing := r
						failing.Source = func(chat.Image) (string, string, string, error) { return "", "", "", errors.New("gone") }
						_, _ = d.EncodeSession(failing)
					}
					memoed, err := d.EncodeSession(r)
					if err != nil {
						t.Fatal(err)
					}
					if !bytes.Equal(plain.Bytes(), memoed.Bytes()) {
						t.Fatalf("request %d with the memo:\n%s\nwithout:\n%s", req, memoed.Bytes(), plain.Bytes())
					}
					msgs = chat.CloneMessages(msgs) // the caller's next request is a copy
				}
			})
		})
	}
}

func drawMessage(t *rapid.T, n int) chat.Message {
	text := rapid.SampledFrom([]string{"open the page", "done", "the form is filled", ""}).Draw(t, "text")
	switch rapid.IntRange(0, 4).Draw(t, "kind") {
	case 0:
		return chat.Message{Role: chat.User, Parts: []chat.Part{chat.Text{Text: text}}}
	case 1:
		return chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: text}, chat.ToolCall{ID: fmt.Sprint("c", n), Name: "shot", Arguments: "{}"}}}
	case 2:
		return chat.Message{Role: chat.Tool, Parts: []chat.Part{chat.ToolResult{CallID: fmt.Sprint("c", n), Name: "shot",
			Parts: []chat.Part{chat.Text{Text: "captured"}, chat.Image{Ref: blob.Of([]byte(text)), MediaType: "image/png", Width: 10, Height: 10}}}}}
	case 3:
		return chat.Message{Role: chat.User, Parts: []chat.Part{chat.Marker{Of: "image", Reason: "budget", Caption: text}}}
	default:
		return chat.Message{Role: chat.Assistant, Parts: []chat.Part{chat.Text{Text: text + " ok"}}}
	}
}
