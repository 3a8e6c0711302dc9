package anthropic

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/imgctx/imgctx/wire"
)

// FilesBeta is the beta the Files API and file references ask for.
const FilesBeta = "files-api-2025-04-14"

// Files is Anthropic's Files API (POST /v1/files, multipart; an image
// block's source {"type":"file","file_id":…}). Its files stay until deleted.
var Files = &wire.Files{
	Upload: func(ctx context.Context, call wire.Call, data []byte, mediaType string) (wire.File, error) {
		body, ct := wire.Multipart(nil, "file", wire.FileName(mediaType), mediaType, data)
		_, resp, err := call.Send(ctx, wire.FileRequest{Method: http.MethodPost, Path: "/v1/files",
			Header: http.Header{"Anthropic-Beta": {FilesBeta}}, ContentType: ct, Body: body})
		if err != nil {
			return wire.File{}, err
		}
		var f struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(resp, &f); err != nil || f.ID == "" {
			return wire.File{}, fmt.Errorf("files API: an upload answer without an id: %.200s", resp)
		}
		return wire.File{ID: f.ID}, nil
	},
	Delete: func(ctx context.Context, call wire.Call, f wire.File) error {
		return call.Remove(ctx, wire.FileRequest{Method: http.MethodDelete, Path: "/v1/files/" + f.ID,
			Header: http.Header{"Anthropic-Beta": {FilesBeta}}})
	},
	Edit: func(_ []byte, slot wire.Slot, f wire.File) wire.Edit {
		return wire.Edit{Start: slot.Source.Start, End: slot.Source.End, Write: func(w *wire.BodyWriter) {
			w.WriteString(`{"type":"file","file_id":`)
			w.Write(wire.Quote(f.ID))
			w.WriteByte('}')
		}}
	},
	Header: map[string]string{"Anthropic-Beta": FilesBeta},
}
