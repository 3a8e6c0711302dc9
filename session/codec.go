package session

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/policy"
)

// Version of the JSON written for states and log entries (docs/format.md).
const Version = 1

type stateJSON struct {
	Version      int                  `json:"version"`
	Live         []chat.Message       `json:"live,omitempty"` // written by EncodeState, message by message
	Keep         policy.KeepState     `json:"keep"`
	LastUsage    chat.Usage           `json:"last_usage"`
	LastActivity time.Time            `json:"last_activity"`
	TurnStart    int                  `json:"turn_start"`
	TurnOpen     bool                 `json:"turn_open"`
	Turn         *policy.TurnSnapshot `json:"turn,omitempty"`
	Answered     *Answered            `json:"answered,omitempty"`
	FilesFrom    *int                 `json:"files_from,omitempty"`
}

// EncodeState writes a state as versioned JSON: the live context first,
// each message from s.Encoded where the memo has it (and into the memo
// where it does not), then the rest.
func EncodeState(s State) ([]byte, error) {
	rest, err := restJSON(s, Version)
	if err != nil {
		return nil, err
	}
	live, err := liveJSON(s)
	if err != nil {
		return nil, err
	}
	n := len(rest) + 16
	for _, b := range live {
		n += len(b) + 1
	}
	out := make([]byte, 0, n)
	if s.Live == nil {
		return append(append(out, `{"live":null,`...), rest[1:]...), nil
	}
	out = append(out, `{"live":[`...)
	for i, b := range live {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, b...)
	}
	out = append(out, "],"...)
	return append(out, rest[1:]...), nil // rest is an object with "version" at least
}

// restJSON is the state but its live context, as a JSON object.
func restJSON(s State, version int) ([]byte, error) {
	return json.Marshal(stateJSON{version, nil, s.Keep, s.LastUsage, s.LastActivity.UTC(), s.TurnStart, s.TurnOpen, s.Turn, s.Answered, s.FilesFrom})
}

// liveJSON is each live message's JSON: from the memo (s.Encoded) where
// it has it, encoded and put in the memo where it does not.
func liveJSON(s State) ([][]byte, error) {
	memo := s.Encoded
	if len(memo) != len(s.Live) {
		memo = make([][]byte, len(s.Live))
	}
	for i, m := range s.Live {
		if memo[i] == nil {
			b, err := json.Marshal(m)
			if err != nil {
				return nil, err
			}
			memo[i] = b
		}
	}
	return memo, nil
}

// RowsVersion is the version of a SQL store's state whose live context
// is kept a row per message (migration 005): the state names how many.
const RowsVersion = 2

// storedJSON is what decoding a stored state reads beyond stateJSON.
type storedJSON struct {
	stateJSON
	LiveRows *int `json:"live_rows,omitempty"`
}

// DecodeState reads what EncodeState wrote.
func DecodeState(b []byte) (State, error) {
	return DecodeStored(b, nil)
}

// DecodeStored reads a SQL store's state: the live context inline
// (EncodeState's, and states written before migration 005), or from its
// rows, which rows reads in order (called only for such a state).
func DecodeStored(b []byte, rows func() ([][]byte, error)) (State, error) {
	var j storedJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return State{}, fmt.Errorf("decode session state: %w", err)
	}
	switch {
	case j.Version == Version:
	case j.Version == RowsVersion && j.LiveRows != nil && rows != nil:
		bodies, err := rows()
		if err != nil {
			return State{}, fmt.Errorf("load the live context: %w", err)
		}
		if len(bodies) != *j.LiveRows {
			return State{}, fmt.Errorf("session state names %d live messages; %d rows hold them", *j.LiveRows, len(bodies))
		}
		j.Live = make([]chat.Message, len(bodies))
		for i, body := range bodies {
			if err := json.Unmarshal(body, &j.Live[i]); err != nil {
				return State{}, fmt.Errorf("live message %d: %w", i, err)
			}
		}
	default:
		return State{}, fmt.Errorf("session state version %d not supported", j.Version)
	}
	return State{Live: j.Live, Keep: j.Keep, LastUsage: j.LastUsage, LastActivity: j.LastActivity, TurnStart: j.TurnStart, TurnOpen: j.TurnOpen, Turn: j.Turn, Answered: j.Answered, FilesFrom: j.FilesFrom}, nil
}

// entryBody is an entry's payload, without its sequence number and time.
type entryBody struct {
	Message    *chat.Message            `json:"message,omitempty"`
	Compaction *policy.CompactionRecord `json:"compaction,omitempty"`
}

// EncodeEntry writes an entry's payload and names its kind.
func EncodeEntry(e Entry) (kind string, body []byte, err error) {
	switch {
	case e.Message != nil && e.Compaction == nil:
		kind = "message"
	case e.Compaction != nil && e.Message == nil:
		kind = "compaction"
	default:
		return "", nil, fmt.Errorf("a log entry holds exactly one message or one compaction")
	}
	body, err = json.Marshal(entryBody{e.Message, e.Compaction})
	return kind, body, err
}

// DecodeEntry reads what EncodeEntry wrote.
func DecodeEntry(seq int64, at time.Time, body []byte) (Entry, error) {
	var b entryBody
	if err := json.Unmarshal(body, &b); err != nil {
		return Entry{}, fmt.Errorf("decode log entry %d: %w", seq, err)
	}
	switch {
	case b.Message == nil && b.Compaction == nil:
		return Entry{}, fmt.Errorf("decode log entry %d: it holds neither a message nor a compaction", seq)
	case b.Message != nil && b.Compaction != nil:
		return Entry{}, fmt.Errorf("decode log entry %d: it holds both a message and a compaction", seq)
	}
	return Entry{Seq: seq, At: at, Message: b.Message, Compaction: b.Compaction}, nil
}

// metaJSON is a session's meta column: its thread and settings.
type metaJSON struct {
	Thread   chat.Thread `json:"thread,omitempty"`
	Model    string      `json:"model,omitempty"`
	KeepTurn bool        `json:"keep_turn_images,omitempty"`
	Recall   bool        `json:"recall,omitempty"`
}

// EncodeMeta writes the stored part of a session's meta: its thread and
// settings (docs/format.md).
func EncodeMeta(m Meta) string {
	b, _ := json.Marshal(metaJSON{m.Thread, m.Settings.Model, m.Settings.KeepTurnImages, m.Settings.Recall})
	return string(b)
}

// DecodeMeta reads what EncodeMeta wrote into a meta of that session,
// tenant and times.
func DecodeMeta(id ID, tenant string, created, updated int64, s string) (Meta, error) {
	var mj metaJSON
	if err := json.Unmarshal([]byte(s), &mj); err != nil {
		return Meta{}, fmt.Errorf("load session meta: %w", err)
	}
	return Meta{ID: id, Tenant: tenant, Thread: mj.Thread, Settings: chat.Settings{Model: mj.Model, KeepTurnImages: mj.KeepTurn, Recall: mj.Recall},
		Created: time.Unix(0, created).UTC(), Updated: time.Unix(0, updated).UTC()}, nil
}

// Rows is what the SQL stores' query results offer (database/sql's and
// pgx's alike).
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// loadJSONRows reads rows of one JSON text column, each decoded.
func loadJSONRows[T any](rows Rows, what string, decode func([]byte) (T, error)) ([]T, error) {
	var out []T
	for rows.Next() {
		var b string
		if err := rows.Scan(&b); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		v, err := decode([]byte(b))
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// LoadLive reads a live context's rows (body), in order, as DecodeStored
// takes them.
func LoadLive(rows Rows) ([][]byte, error) {
	return loadJSONRows(rows, "load the live context", func(b []byte) ([]byte, error) { return b, nil })
}

// LoadSnapshot builds a snapshot from its meta, its state's JSON (with
// the rows of its live context, see DecodeStored) and its log's rows (seq,
// at in Unix nanoseconds, body), read in order: the load both SQL stores
// share.
func LoadSnapshot(meta Meta, state string, live func() ([][]byte, error), log Rows) (Snapshot, error) {
	snap := Snapshot{Meta: meta}
	var err error
	if snap.State, err = DecodeStored([]byte(state), live); err != nil {
		return Snapshot{}, err
	}
	for log.Next() {
		var seq, at int64
		var body string
		if err := log.Scan(&seq, &at, &body); err != nil {
			return Snapshot{}, fmt.Errorf("load log: %w", err)
		}
		e, err := DecodeEntry(seq, time.Unix(0, at).UTC(), []byte(body))
		if err != nil {
			return Snapshot{}, err
		}
		snap.Log = append(snap.Log, e)
	}
	return snap, log.Err()
}

// Appending is an append encoded for a SQL store, before its transaction:
// the new state, the live context's rows, and each entry's kind and body.
type Appending struct {
	// State names how many live rows there are (RowsVersion), or holds
	// a nil live context inline.
	State []byte
	// Live is each live message's JSON; the first Unchanged are those the
	// state this one replaces held at the same places (State.Unchanged).
	Live      [][]byte
	Unchanged int
	Kinds     []string
	Bodies    [][]byte
}

// EncodeAppend encodes entries and the state that follows them.
func EncodeAppend(entries []Entry, st State) (Appending, error) {
	a := Appending{Kinds: make([]string, len(entries)), Bodies: make([][]byte, len(entries))}
	var err error
	if st.Live == nil {
		a.State, err = EncodeState(st)
	} else {
		a.Live, err = liveJSON(st)
		if err == nil {
			a.State, err = restJSON(st, RowsVersion)
		}
		if err == nil {
			a.State = append(fmt.Appendf(nil, `{"live_rows":%d,`, len(a.Live)), a.State[1:]...)
			a.Unchanged = min(max(st.Unchanged, 0), len(a.Live))
		}
	}
	if err != nil {
		return Appending{}, err
	}
	for i, e := range entries {
		if a.Kinds[i], a.Bodies[i], err = EncodeEntry(e); err != nil {
			return Appending{}, err
		}
	}
	return a, nil
}

// RowsFrom is the first live row an append must write, given the state
// it replaces as stored: rows before it hold what they should (the
// append's Unchanged, as far as that state kept its live context in rows).
func (a Appending) RowsFrom(stored string) int {
	if a.Unchanged == 0 {
		return 0
	}
	var j struct {
		Version  int  `json:"version"`
		LiveRows *int `json:"live_rows"`
	}
	if json.Unmarshal([]byte(stored), &j) != nil || j.Version != RowsVersion || j.LiveRows == nil {
		return 0
	}
	return min(a.Unchanged, *j.LiveRows)
}

// Numbered is entries as appended after the log's last sequence number,
// at now.
func Numbered(entries []Entry, last int64, now time.Time) []Entry {
	out := slices.Clone(entries)
	for i := range out {
		out[i].Seq, out[i].At = last+int64(i)+1, now
	}
	return out
}

// Creating is a new session as a SQL store inserts it: its meta checked
// (the tenant), named when it has no id, dated now, and encoded, with the
// empty state.
func Creating(meta Meta, now time.Time) (Meta, string, string, error) {
	if err := imagestore.ValidTenant(meta.Tenant); err != nil {
		return Meta{}, "", "", err
	}
	if meta.ID == "" {
		meta.ID = NewID()
	}
	meta.Created, meta.Updated = now, now
	st, err := EncodeState(State{})
	return meta, EncodeMeta(meta), string(st), err
}
