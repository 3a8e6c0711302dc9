// Package session persists conversations: an append-only log of every
// message and compaction record, and the state the engine resumes from (the
// live context with its keep states and measured costs, what keeping has
// learned, the last usage). Entries and the state that goes with them are
// written in one transaction, so a restart resumes exactly and nothing is
// ever half written. Sessions are scoped by tenant: another tenant's session
// answers ErrNotFound, exactly like a missing one.
//
// Implementations: Mem here, SQLite in session/sqlite, PostgreSQL in
// session/postgres; all pass the conformance suite in session/sessiontest.
package session

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
)

// ErrNotFound is returned for a session that does not exist for the tenant.
var ErrNotFound = errors.New("session not found")

// ID names a session.
type ID string

// NewID returns a random session ID ("s_" and 24 hex digits).
func NewID() ID {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return ID("s_" + hex.EncodeToString(b[:]))
}

// Meta describes a session.
type Meta struct {
	ID       ID
	Tenant   string
	Thread   chat.Thread
	Settings chat.Settings
	Created  time.Time
	Updated  time.Time
}

// Entry is one record of the append-only log: a message or a compaction.
type Entry struct {
	Seq        int64 // assigned by the store, from 1
	At         time.Time
	Message    *chat.Message
	Compaction *policy.CompactionRecord
}

// State is what the engine resumes from.
type State struct {
	Live         []chat.Message   // the live context: what the next request starts from
	Keep         policy.KeepState // what keeping learned, and the measurement base
	LastUsage    chat.Usage
	LastActivity time.Time // for microcompaction's idle trigger
	TurnStart    int       // index in Live of the current turn's first message
	TurnOpen     bool      // a turn is in progress (the last reply called tools)
	// Turn is the keep-images state of the open turn, nil between turns.
	Turn *policy.TurnSnapshot
	// Answered is the last turn's answer when its request carried an
	// idempotency key: a retry with the same key gets it again.
	Answered *Answered
	// FilesFrom is the first live message whose images go by file id
	// (upstream.file_ids); nil: the session never used file ids.
	FilesFrom *int
	// Encoded is a memo, never stored: Encoded[i], when not nil, is
	// Live[i]'s JSON as EncodeState writes it, carried from the turn
	// before for the messages that did not change. EncodeState fills in
	// the nil ones (when Encoded is as long as Live), so a turn encodes
	// only what is new.
	Encoded [][]byte
	// Unchanged, never stored, says the first Unchanged live messages are
	// those of the state this one replaces, at the same places: a store
	// that keeps them a row each leaves those rows as they are (0: every
	// row is written).
	Unchanged int
}

// Answered is a turn's answer kept for a retry of its request.
type Answered struct {
	Key     string       `json:"key"`
	Digest  string       `json:"digest"` // SHA-256 of the request's messages
	Reply   chat.Message `json:"reply"`
	Usage   *chat.Usage  `json:"usage,omitempty"`
	TurnEnd bool         `json:"turn_end"`
}

// Current is what LoadState returns: State is nil when the log still
// ends at the sequence number the caller knew.
type Current struct {
	Meta  Meta
	Seq   int64
	State *State
}

// DecodeCurrent builds a Current from a SQL store's row: the state (with
// its live rows, see DecodeStored) is decoded only when the log moved past
// known.
func DecodeCurrent(meta Meta, seq, known int64, state string, live func() ([][]byte, error)) (Current, error) {
	c := Current{Meta: meta, Seq: seq}
	if known != 0 && seq == known {
		return c, nil
	}
	st, err := DecodeStored([]byte(state), live)
	if err != nil {
		return Current{}, err
	}
	c.State = &st
	return c, nil
}

// Snapshot is everything stored about a session.
type Snapshot struct {
	Meta  Meta
	Log   []Entry
	State State
}

// Store persists sessions. All methods are safe for concurrent use.
type Store interface {
	// Create stores a new session; an empty meta.ID gets a fresh one.
	Create(ctx context.Context, meta Meta) (Meta, error)
	// Load returns a session's meta, log and state.
	Load(ctx context.Context, tenant string, id ID) (Snapshot, error)
	// LoadState returns what a turn starts from, without the log: the
	// meta, the log's last sequence number, and the state — read only
	// when the log no longer ends at known (0: always read). The engine
	// writes a state only with at least one entry, so a log that still
	// ends at known means the caller's copy of the state is current.
	LoadState(ctx context.Context, tenant string, id ID, known int64) (Current, error)
	// Append adds entries to the log and replaces the state, atomically. It
	// assigns the entries' sequence numbers and returns them as stored.
	Append(ctx context.Context, tenant string, id ID, entries []Entry, st State) ([]Entry, error)
	// SetSettings replaces a session's settings (model, keep switch) and
	// returns its meta; the engine reads them at the next turn's start.
	SetSettings(ctx context.Context, tenant string, id ID, st chat.Settings) (Meta, error)
	// List returns the tenant's sessions, oldest first.
	List(ctx context.Context, tenant string) ([]Meta, error)
	// Delete removes a session and its log; a missing one is ErrNotFound.
	Delete(ctx context.Context, tenant string, id ID) error
	// LoadProxied returns the decisions stored for a proxied conversation,
	// by its hashed key; ErrNotFound when there are none.
	LoadProxied(ctx context.Context, tenant, key string) (Proxied, error)
	// SaveProxied replaces them.
	SaveProxied(ctx context.Context, tenant, key string, p Proxied) error
	// ExpireProxied deletes the proxied conversations idle since before
	// the time, with their recall handles, and says how many.
	ExpireProxied(ctx context.Context, idleBefore time.Time) (int, error)
	// ActiveProxied counts the proxied conversations with a request since
	// the time, of every tenant (store gc asks whether any is live).
	ActiveProxied(ctx context.Context, since time.Time) (int, error)
	// SaveRecalls records the handles of images a conversation may recall;
	// a handle stored already keeps what it first said.
	SaveRecalls(ctx context.Context, tenant string, rs []Recall) error
	// LoadRecall resolves a handle within the tenant; ErrNotFound when the
	// tenant has no such handle.
	LoadRecall(ctx context.Context, tenant, handle string) (Recall, error)
	// ListRecalls returns a conversation's recallable images, newest
	// removal first, at most MaxRecallList.
	ListRecalls(ctx context.Context, tenant, conversation string) ([]Recall, error)
	// AppendRequests adds lines to the request log.
	AppendRequests(ctx context.Context, rs []Request) error
	// ListRequests returns the lines a filter selects, newest first.
	ListRequests(ctx context.Context, f RequestFilter) ([]Request, error)
	// SumRequests sums the tenant's lines since the time, by model and
	// hour, oldest first.
	SumRequests(ctx context.Context, tenant string, since time.Time) ([]Totals, error)
	// TrimRequests deletes the lines older than the time and, when keep is
	// positive, all but the newest keep; it says how many are left.
	TrimRequests(ctx context.Context, before time.Time, keep int) (left int, err error)
	// LoadFile returns the provider file stored under k; ErrNotFound
	// when there is none.
	LoadFile(ctx context.Context, k FileKey) (ProviderFile, error)
	// SaveFile stores a provider file, replacing one under the same key.
	SaveFile(ctx context.Context, f ProviderFile) error
	// DeleteFile forgets a provider file (a missing one is no error).
	DeleteFile(ctx context.Context, k FileKey) error
	// StaleFiles returns the provider files last used before the time (or
	// expired by then), least recently used first, at most MaxStaleFiles.
	StaleFiles(ctx context.Context, usedBefore time.Time) ([]ProviderFile, error)
	// Ping reports whether the store can serve, in constant time (a
	// readiness probe calls it).
	Ping(ctx context.Context) error
	// Close releases the store.
	Close() error
}

// Shared is implemented by stores that several processes use at once
// (gateway replicas on one PostgreSQL). The engine then holds Lock around
// each turn of a session — its upstream call is paid for, so two replicas
// must not both run it from the same state — and reads a proxied
// conversation's decisions from the store on every request instead of
// trusting what it remembers.
type Shared interface {
	Store
	// Lock holds the session against every other process until unlock.
	Lock(ctx context.Context, tenant string, id ID) (unlock func(), err error)
}
