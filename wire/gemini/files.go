package gemini

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/imgctx/imgctx/wire"
)

// Files is Gemini's Files API: a resumable upload in two calls (start at
// /upload/v1beta/files, then the bytes to the session URL the answer
// names), files that expire after 48 hours, and a part's fileData naming
// the file's URI.
var Files = &wire.Files{
	Upload: func(ctx context.Context, call wire.Call, data []byte, mediaType string) (wire.File, error) {
		meta, _ := json.Marshal(map[string]any{"file": map[string]string{"display_name": wire.FileName(mediaType)}})
		h, _, err := call.Send(ctx, wire.FileRequest{Method: http.MethodPost, Path: "/upload/v1beta/files", ContentType: "application/json", Body: meta,
			Header: http.Header{"X-Goog-Upload-Protocol": {"resumable"}, "X-Goog-Upload-Command": {"start"},
				"X-Goog-Upload-Header-Content-Length": {strconv.Itoa(len(data))}, "X-Goog-Upload-Header-Content-Type": {mediaType}}})
		if err != nil {
			return wire.File{}, err
		}
		session := h.Get("X-Goog-Upload-Url")
		if session == "" {
			return wire.File{}, fmt.Errorf("files API: the upload start named no upload URL")
		}
		_, resp, err := call.Send(ctx, wire.FileRequest{Method: http.MethodPost, URL: session, ContentType: mediaType, Body: data,
			Header: http.Header{"X-Goog-Upload-Command": {"upload, finalize"}, "X-Goog-Upload-Offset": {"0"}}})
		if err != nil {
			return wire.File{}, err
		}
		var f struct {
			File struct {
				Name           string    `json:"name"`
				URI            string    `json:"uri"`
				ExpirationTime time.Time `json:"expirationTime"`
			} `json:"file"`
		}
		if err := json.Unmarshal(resp, &f); err != nil || f.File.Name == "" || f.File.URI == "" {
			return wire.File{}, fmt.Errorf("files API: an upload answer without a file: %.200s", resp)
		}
		out := wire.File{ID: f.File.Name, URI: f.File.URI, Expires: f.File.ExpirationTime.UTC()}
		if out.Expires.IsZero() {
			out.Expires = time.Now().Add(48 * time.Hour).UTC()
		}
		return out, nil
	},
	Delete: func(ctx context.Context, call wire.Call, f wire.File) error {
		// 403 is Gemini's answer for a file gone.
		return call.Remove(ctx, wire.FileRequest{Method: http.MethodDelete, Path: "/v1beta/" + f.ID}, http.StatusForbidden)
	},
	// The inlineData member becomes a fileData member in the same
	// spelling; the part's other members stay as the client sent them.
	Edit: func(body []byte, slot wire.Slot, f wire.File) wire.Edit {
		write := func(w *wire.BodyWriter, snake bool) {
			if snake {
				w.WriteString(`"file_data":{"mime_type":`)
			} else {
				w.WriteString(`"fileData":{"mimeType":`)
			}
			w.Write(wire.Quote(slot.MediaType))
			if snake {
				w.WriteString(`,"file_uri":`)
			} else {
				w.WriteString(`,"fileUri":`)
			}
			w.Write(wire.Quote(f.URI))
			w.WriteByte('}')
		}
		if start, name, ok := wire.KeyBefore(body, slot.Source.Start); ok && (name == "inlineData" || name == "inline_data") {
			return wire.Edit{Start: start, End: slot.Source.End, Write: func(w *wire.BodyWriter) { write(w, name == "inline_data") }}
		}
		return wire.Edit{Start: slot.Part.Start, End: slot.Part.End, Write: func(w *wire.BodyWriter) {
			w.WriteByte('{')
			write(w, false)
			w.WriteByte('}')
		}}
	},
}
