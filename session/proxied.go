package session

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/policy"
	"github.com/imgctx/imgctx/reason"
)

// Proxied is what the engine decided for a conversation it sees through a
// drop-in route. The client re-sends its whole history on every request,
// so only decisions are stored, never messages: which image occurrences
// are kept (at what measured cost), which were removed and why, the open
// turn's keep state and the measurement base. A decision, once taken, is
// never rewritten, so the same history gives the same upstream body after
// a restart or on another replica.
type Proxied struct {
	Model        string               `json:"model,omitempty"`
	Messages     int                  `json:"messages"` // in the last request
	TurnAt       int                  `json:"turn_at"`  // the open turn's human message; -1 none
	Turn         *policy.TurnSnapshot `json:"turn,omitempty"`
	Images       []Decided            `json:"images,omitempty"`
	Keep         policy.KeepState     `json:"keep"`
	LastUsage    chat.Usage           `json:"last_usage"`
	LastActivity time.Time            `json:"last_activity"`
	// FilesFrom is the first message whose images go by file id
	// (upstreams[].file_ids); images before it keep the form a cached
	// prefix holds them in. nil: the conversation never used file ids.
	FilesFrom *int `json:"files_from,omitempty"`
	// LeftAt is how many messages the request had whose window refusal
	// imgctx left to the client, to compact (proxy.client_window); a later
	// request as long did not compact, and gets the window's relief.
	LeftAt int `json:"left_at,omitempty"`
}

// Decided is one image occurrence's decision, at its place in the client's
// history: message, part, and the part inside that tool result (-1 when
// the image is not in one).
type Decided struct {
	Msg    int         `json:"msg"`
	Part   int         `json:"part"`
	Nested int         `json:"nested"`
	Ref    blob.Ref    `json:"ref"`
	Keep   chat.Keep   `json:"keep"` // kept, removed, or a relay of the open turn (its Occ)
	Reason reason.Code `json:"reason,omitempty"`
	Cost   int         `json:"cost,omitempty"`
	Occ    int         `json:"occ,omitempty"`
}

// ProxiedVersion is the version of a stored Proxied (docs/format.md).
const ProxiedVersion = 1

type proxiedJSON struct {
	Version int `json:"version"`
	Proxied
}

// EncodeProxied writes a proxied state as versioned JSON.
func EncodeProxied(p Proxied) ([]byte, error) {
	p.LastActivity = p.LastActivity.UTC()
	return json.Marshal(proxiedJSON{ProxiedVersion, p})
}

// DecodeProxied reads what EncodeProxied wrote.
func DecodeProxied(b []byte) (Proxied, error) {
	var j proxiedJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return Proxied{}, fmt.Errorf("decode proxied state: %w", err)
	}
	if j.Version != ProxiedVersion {
		return Proxied{}, fmt.Errorf("proxied state version %d not supported", j.Version)
	}
	return j.Proxied, nil
}
