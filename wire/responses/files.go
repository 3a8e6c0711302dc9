package responses

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/imgctx/imgctx/wire"
)

// FileLifetime is how long OpenAI keeps a file imgctx uploads
// (expires_after): what no conversation used in that time, the provider
// deletes itself.
const FileLifetime = 7 * 24 * time.Hour

// Files is OpenAI's Files API (POST /v1/files, multipart, purpose
// "vision"; an input_image's file_id).
var Files = &wire.Files{
	Upload: func(ctx context.Context, call wire.Call, data []byte, mediaType string) (wire.File, error) {
		body, ct := wire.Multipart(map[string]string{"purpose": "vision", "expires_after[anchor]": "created_at",
			"expires_after[seconds]": strconv.Itoa(int(FileLifetime.Seconds()))}, "file", wire.FileName(mediaType), mediaType, data)
		_, resp, err := call.Send(ctx, wire.FileRequest{Method: http.MethodPost, Path: "/v1/files", ContentType: ct, Body: body})
		if err != nil {
			return wire.File{}, err
		}
		var f struct {
			ID        string `json:"id"`
			ExpiresAt int64  `json:"expires_at"`
		}
		if err := json.Unmarshal(resp, &f); err != nil || f.ID == "" {
			return wire.File{}, fmt.Errorf("files API: an upload answer without an id: %.200s", resp)
		}
		out := wire.File{ID: f.ID}
		if f.ExpiresAt > 0 {
			out.Expires = time.Unix(f.ExpiresAt, 0).UTC()
		}
		return out, nil
	},
	Delete: func(ctx context.Context, call wire.Call, f wire.File) error {
		return call.Remove(ctx, wire.FileRequest{Method: http.MethodDelete, Path: "/v1/files/" + f.ID})
	},
	// The image_url member becomes a file_id member; the rest of the part
	// (its type, detail and any other field) stays as the client sent it.
	Edit: func(body []byte, slot wire.Slot, f wire.File) wire.Edit {
		if start, name, ok := wire.KeyBefore(body, slot.Source.Start); ok && name == "image_url" {
			return wire.Edit{Start: start, End: slot.Source.End, Write: func(w *wire.BodyWriter) {
				w.WriteString(`"file_id":`)
				w.Write(wire.Quote(f.ID))
			}}
		}
		return wire.Edit{Start: slot.Part.Start, End: slot.Part.End, Write: func(w *wire.BodyWriter) {
			w.WriteString(`{"type":"input_image","file_id":`)
			w.Write(wire.Quote(f.ID))
			if slot.Detail != "" {
				w.WriteString(`,"detail":`)
				w.Write(wire.Quote(slot.Detail))
			}
			w.WriteByte('}')
		}}
	},
}
