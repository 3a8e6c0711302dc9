package session

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/imgctx/imgctx/chat"
)

// exportLine is one line of the JSONL export.
type exportLine struct {
	Type    string          `json:"type"` // "session", "entry", "state"
	Version int             `json:"version,omitempty"`
	ID      ID              `json:"id,omitempty"`
	Tenant  string          `json:"tenant,omitempty"`
	Thread  chat.Thread     `json:"thread,omitempty"`
	Model   string          `json:"model,omitempty"`
	Keep    bool            `json:"keep_turn_images,omitempty"`
	Created *time.Time      `json:"created,omitempty"`
	Updated *time.Time      `json:"updated,omitempty"`
	Seq     int64           `json:"seq,omitempty"`
	At      *time.Time      `json:"at,omitempty"`
	Kind    string          `json:"kind,omitempty"`
	Body    json.RawMessage `json:"body,omitempty"`
	State   json.RawMessage `json:"state,omitempty"`
}

// ExportJSONL writes a snapshot as JSON lines: the session, every log entry
// in order, then the state. ImportJSONL reads it back exactly.
func ExportJSONL(w io.Writer, s Snapshot) error {
	enc := json.NewEncoder(w)
	created, updated := s.Meta.Created.UTC(), s.Meta.Updated.UTC()
	if err := enc.Encode(exportLine{Type: "session", Version: Version, ID: s.Meta.ID, Tenant: s.Meta.Tenant,
		Thread: s.Meta.Thread, Model: s.Meta.Settings.Model, Keep: s.Meta.Settings.KeepTurnImages,
		Created: &created, Updated: &updated}); err != nil {
		return err
	}
	for _, e := range s.Log {
		kind, body, err := EncodeEntry(e)
		if err != nil {
			return err
		}
		at := e.At.UTC()
		if err := enc.Encode(exportLine{Type: "entry", Seq: e.Seq, At: &at, Kind: kind, Body: body}); err != nil {
			return err
		}
	}
	state, err := EncodeState(s.State)
	if err != nil {
		return err
	}
	return enc.Encode(exportLine{Type: "state", State: state})
}

// ImportJSONL reads what ExportJSONL wrote.
func ImportJSONL(r io.Reader) (Snapshot, error) {
	var s Snapshot
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	n, sawState := 0, false
	for sc.Scan() {
		n++
		var l exportLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return Snapshot{}, fmt.Errorf("line %d: %w", n, err)
		}
		switch {
		case n == 1 && l.Type == "session":
			if l.Version != Version {
				return Snapshot{}, fmt.Errorf("export version %d not supported", l.Version)
			}
			s.Meta = Meta{ID: l.ID, Tenant: l.Tenant, Thread: l.Thread, Settings: chat.Settings{Model: l.Model, KeepTurnImages: l.Keep}}
			if l.Created != nil {
				s.Meta.Created, s.Meta.Updated = *l.Created, *l.Created
			}
			if l.Updated != nil {
				s.Meta.Updated = *l.Updated
			}
		case n > 1 && l.Type == "entry" && !sawState:
			if l.At == nil {
				return Snapshot{}, fmt.Errorf("line %d: an entry without its time (at)", n)
			}
			e, err := DecodeEntry(l.Seq, *l.At, l.Body)
			if err != nil {
				return Snapshot{}, fmt.Errorf("line %d: %w", n, err)
			}
			s.Log = append(s.Log, e)
		case n > 1 && l.Type == "state" && !sawState:
			st, err := DecodeState(l.State)
			if err != nil {
				return Snapshot{}, fmt.Errorf("line %d: %w", n, err)
			}
			s.State, sawState = st, true
		default:
			return Snapshot{}, fmt.Errorf("line %d: unexpected %q line", n, l.Type)
		}
	}
	if err := sc.Err(); err != nil {
		return Snapshot{}, err
	}
	if !sawState {
		return Snapshot{}, fmt.Errorf("export has no state line: truncated")
	}
	return s, nil
}
