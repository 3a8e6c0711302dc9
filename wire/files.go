package wire

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"slices"
	"time"
)

// Files is a wire's Files API: an image stored at the provider once and
// named by reference in requests from then on, instead of its base64. A
// wire whose requests have no file form for images (Chat Completions) has
// none.
type Files struct {
	// Upload stores data at the provider through call (which sends with
	// the upstream's address and the request's credentials) and returns
	// the provider's file.
	Upload func(ctx context.Context, call Call, data []byte, mediaType string) (File, error)
	// Delete removes a file from the provider.
	Delete func(ctx context.Context, call Call, f File) error
	// Edit is the change to body that sends slot as a reference to f.
	Edit func(body []byte, slot Slot, f File) Edit
	// Header is added to a request that carries file references (a beta
	// the provider asks for), merged with the client's value.
	Header map[string]string
}

// File is a file stored at a provider: its id, the URI a wire names it by
// (Gemini), and when the provider forgets it (zero: never by itself).
type File struct {
	ID, URI string
	Expires time.Time
}

// Call sends one request to the upstream, with its address and the
// credentials of the request being served, and returns the answer's status,
// headers and body (a non-2xx status is an answer, not an error).
type Call func(ctx context.Context, r FileRequest) (status int, h http.Header, body []byte, err error)

// FileRequest is one call of a Files API: method, path (or a whole URL the
// provider gave, Gemini's upload session), headers, body and its type.
type FileRequest struct {
	Method, Path, URL string
	Header            http.Header
	ContentType       string
	Body              []byte
}

// FileError is a Files API call the provider refused: its status and what
// it said. Quota says the provider's storage or rate limit was reached;
// Unsupported, that the upstream has no Files API (an OpenAI-compatible
// server without /v1/files).
type FileError struct {
	Status             int
	Body               string
	Quota, Unsupported bool
}

func (e *FileError) Error() string {
	return fmt.Sprintf("files API: status %d: %s", e.Status, e.Body)
}

// fileURL is how a session request's image Source names a provider file
// (an encoder with a file form writes it as one): no client URL has it.
const fileURL = "imgctx-provider-file:"

// FileURL is the Source URL naming the provider file id.
func FileURL(id string) string { return fileURL + id }

// FileOf reads a FileURL.
func FileOf(url string) (id string, ok bool) {
	if len(url) > len(fileURL) && url[:len(fileURL)] == fileURL {
		return url[len(fileURL):], true
	}
	return "", false
}

// Send makes a Files API call and returns the answer's headers and body
// when it succeeded, a *FileError when the provider refused it.
func (c Call) Send(ctx context.Context, r FileRequest) (http.Header, []byte, error) {
	status, h, body, err := c(ctx, r)
	if err == nil && status/100 != 2 {
		err = RefusedFile(status, body)
	}
	return h, body, err
}

// Remove deletes a file: a success, or gone already (the statuses the
// provider answers for a file it does not have), is no error.
func (c Call) Remove(ctx context.Context, r FileRequest, gone ...int) error {
	status, _, body, err := c(ctx, r)
	if err == nil && status/100 != 2 && status != http.StatusNotFound && !slices.Contains(gone, status) {
		err = RefusedFile(status, body)
	}
	return err
}

// RefusedFile is the FileError for an answer that is not a success.
func RefusedFile(status int, body []byte) *FileError {
	return &FileError{Status: status, Body: string(body[:min(len(body), 300)]),
		Quota:       status == http.StatusTooManyRequests || status == http.StatusInsufficientStorage || bytes.Contains(bytes.ToLower(body), []byte("quota")) || bytes.Contains(bytes.ToLower(body), []byte("storage limit")),
		Unsupported: status == http.StatusNotFound || status == http.StatusMethodNotAllowed || status == http.StatusNotImplemented}
}

// Multipart is a multipart/form-data body of fields and one file part
// (the form every Files API but Gemini's takes), and its content type.
func Multipart(fields map[string]string, field, filename, mediaType string, data []byte) ([]byte, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for k, v := range fields {
		_ = mw.WriteField(k, v) // writes to memory
	}
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename=%q`, field, filename))
	h.Set("Content-Type", mediaType)
	pw, _ := mw.CreatePart(h)
	_, _ = pw.Write(data)
	_ = mw.Close()
	return buf.Bytes(), mw.FormDataContentType()
}

// FileName is the name a file is uploaded under: its media type's
// extension, for providers that look at it.
func FileName(mediaType string) string {
	ext := "bin"
	if _, sub, ok := bytes.Cut([]byte(mediaType), []byte("/")); ok && len(sub) > 0 && len(sub) < 16 {
		ext = string(sub)
	}
	return "imgctx." + ext
}

// KeyBefore finds the member name whose value starts at body[vs]: the
// offset of its opening quote and the name, ok false when what stands
// before vs is not a plain `"name":` (an escaped name, say).
func KeyBefore(body []byte, vs int) (start int, name string, ok bool) {
	i := vs - 1
	for i >= 0 && isSpace(body[i]) {
		i--
	}
	if i < 0 || body[i] != ':' {
		return 0, "", false
	}
	i--
	for i >= 0 && isSpace(body[i]) {
		i--
	}
	if i < 1 || body[i] != '"' {
		return 0, "", false
	}
	end := i
	i--
	for i >= 0 && body[i] != '"' {
		if body[i] == '\\' || body[i] < 0x20 {
			return 0, "", false
		}
		i--
	}
	if i < 0 {
		return 0, "", false
	}
	return i, string(body[i+1 : end]), true
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
