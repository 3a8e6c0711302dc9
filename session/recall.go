package session

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/reason"
)

// Recall is one image a conversation was told it can ask for again: the
// handle its marker carries, and what answers it. A handle is written
// once (the first removal names it) and resolves only in its tenant; the
// conversation it belongs to is a proxied conversation's key.
type Recall struct {
	Handle       string      `json:"handle"`
	Conversation string      `json:"conversation"`
	Ref          blob.Ref    `json:"ref"`
	MediaType    string      `json:"media_type,omitempty"` // sanitised
	Caption      string      `json:"caption,omitempty"`
	Reason       reason.Code `json:"reason"`
	// Model is the conversation's model when the image was removed: a
	// recalled image meets its rules.
	Model   string    `json:"model,omitempty"`
	Removed time.Time `json:"removed"`
}

// MaxRecallList bounds what ListRecalls returns: the newest removals.
const MaxRecallList = 200

// sortRecalls orders recalls as ListRecalls returns them: newest removal
// first, then by handle.
func sortRecalls(rs []Recall) {
	slices.SortFunc(rs, func(a, b Recall) int {
		if c := b.Removed.Compare(a.Removed); c != 0 {
			return c
		}
		return strings.Compare(a.Handle, b.Handle)
	})
}

// EncodeRecall writes a recall as JSON, its time in UTC nanoseconds.
func EncodeRecall(r Recall) ([]byte, error) {
	r.Removed = time.Unix(0, r.Removed.UnixNano()).UTC()
	return json.Marshal(r)
}

// DecodeRecall reads what EncodeRecall wrote.
func DecodeRecall(b []byte) (Recall, error) {
	var r Recall
	if err := json.Unmarshal(b, &r); err != nil {
		return Recall{}, fmt.Errorf("decode recall: %w", err)
	}
	return r, nil
}

// LoadRecalls reads a SQL store's recall rows (the recall JSON, in
// order): the list both SQL stores share.
func LoadRecalls(rows Rows) ([]Recall, error) {
	return loadJSONRows(rows, "list recalls", DecodeRecall)
}
