package session

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/imgctx/imgctx/blob"
)

// ProviderFile is an image imgctx uploaded to a provider's Files API
// (upstreams[].file_ids): which image, at which upstream, for which
// credential — a fingerprint, never the credential — and wire, the
// provider's id for it, and when it was last sent. A file is never shared
// across credentials: another key is another key.
type ProviderFile struct {
	FileKey
	ID  string `json:"id"`
	URI string `json:"uri,omitempty"` // Gemini names a file by its URI
	// Expires is when the provider forgets the file (Gemini's 48 hours,
	// OpenAI's expires_after); zero: it keeps it until deleted.
	Expires  time.Time `json:"expires,omitzero"`
	Uploaded time.Time `json:"uploaded"`
	Used     time.Time `json:"used"`
}

// FileKey is what a provider file is found by.
type FileKey struct {
	Upstream   string   `json:"upstream"`   // the upstream's address
	Credential string   `json:"credential"` // the credential's fingerprint
	Wire       string   `json:"wire"`
	Ref        blob.Ref `json:"ref"`
}

// MaxStaleFiles bounds what one StaleFiles call returns.
const MaxStaleFiles = 1000

// sortStale orders stale files as StaleFiles returns them: least recently
// used first.
func sortStale(fs []ProviderFile) {
	slices.SortFunc(fs, func(a, b ProviderFile) int { return a.Used.Compare(b.Used) })
}

// EncodeFile writes a provider file as JSON, its times in UTC.
func EncodeFile(f ProviderFile) ([]byte, error) {
	f.Expires, f.Uploaded, f.Used = f.Expires.UTC(), f.Uploaded.UTC(), f.Used.UTC()
	return json.Marshal(f)
}

// DecodeFile reads what EncodeFile wrote.
func DecodeFile(b []byte) (ProviderFile, error) {
	var f ProviderFile
	if err := json.Unmarshal(b, &f); err != nil {
		return ProviderFile{}, fmt.Errorf("decode provider file: %w", err)
	}
	return f, nil
}

// LoadFiles reads a SQL store's provider file rows (the file JSON, in
// order): the list both SQL stores share.
func LoadFiles(rows Rows) ([]ProviderFile, error) {
	return loadJSONRows(rows, "stale provider files", DecodeFile)
}

// Unix is t in Unix nanoseconds, 0 for the zero time (a file that does
// not expire), as the SQL stores keep times.
func Unix(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
