package gateway

import (
	"mime"
	"net/http"
	"strconv"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/reason"
	"github.com/imgctx/imgctx/wire/openai"
)

type imageInfo struct {
	Ref       string `json:"ref"`
	MediaType string `json:"media_type"`
	Bytes     int64  `json:"bytes"`
	Width     int    `json:"width,omitempty"`
	Height    int    `json:"height,omitempty"`
	Declared  string `json:"declared_media_type,omitempty"`
}

// postImage stores an image sent as raw bytes (with its Content-Type) or as
// JSON {"data_url": "data:…"}.
func (s *Server) postImage(w http.ResponseWriter, r *http.Request, tenant string) {
	body, err := s.readBody(r)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	declared, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	in, err := s.engine.Upload(r.Context(), tenant, body, declared)
	if err != nil {
		if reason.Of(err) != reason.Refused {
			s.metrics.images.WithLabelValues("refused", string(reason.Of(err))).Inc()
		}
		s.fail(w, openai.Dialect, err)
		return
	}
	s.metrics.images.WithLabelValues("stored", "").Inc()
	s.metrics.imageBytes.WithLabelValues("stored").Add(float64(in.Bytes))
	replyJSON(w, http.StatusCreated, imageInfo{Ref: in.Ref.String(), MediaType: in.MediaType, Bytes: in.Bytes,
		Width: in.Width, Height: in.Height, Declared: in.Declared})
}

// getImage returns a stored image (HEAD: its headers). Another tenant's
// ref answers 404 exactly like a missing one.
func (s *Server) getImage(w http.ResponseWriter, r *http.Request, tenant string) {
	ref, err := blob.Parse(r.PathValue("ref"))
	if err != nil {
		s.fail(w, openai.Dialect, reason.Wrap(reason.Invalid, "bad ref", err))
		return
	}
	data, mt, err := s.engine.Image(r.Context(), tenant, ref)
	if err != nil {
		s.fail(w, openai.Dialect, err)
		return
	}
	w.Header().Set("Content-Type", mt)
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.Header().Set("ETag", `"`+ref.String()+`"`)
	w.Header().Set("Cache-Control", "private, max-age=31536000, immutable")
	w.Header().Set("X-Content-Type-Options", "nosniff") // the type is the sniffed one; a browser must not guess another
	if r.Method == http.MethodHead {
		return
	}
	w.Write(data)
}
