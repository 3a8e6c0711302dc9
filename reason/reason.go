// Package reason is the one vocabulary of reason codes that explains why an
// image or document was not sent, kept, or stored. Every path (media
// ingestion, the store, the policies, the gateway) reports with these codes,
// so a count, a log line and a marker all say the same thing.
package reason

import "errors"

// Code names why something was removed, refused or dropped.
type Code string

// The closed set of reason codes. docs/design.md "Reason codes" lists each.
const (
	Budget         Code = "budget"          // image budget full
	Cap            Code = "cap"             // count cap
	Bytes          Code = "bytes"           // byte cap
	Truncated      Code = "truncated"       // its turn was cut by the history budget
	NoVision       Code = "no_vision"       // engine or mode does not see images
	KeyOff         Code = "key_off"         // keep switch turned off
	Unmeasured     Code = "unmeasured"      // trial image never measured
	BelowThreshold Code = "below_threshold" // measured share under the threshold
	Overflow       Code = "overflow"        // removed to recover from prompt-too-long or a cut completion
	Idle           Code = "idle"            // microcompaction
	Compaction     Code = "compaction"      // covered by a summary
	ProviderLimit  Code = "provider_limit"  // would break a provider rule
	Window         Code = "window"          // removed under window pressure, before the prompt outgrows the window
	Priced         Code = "priced"          // holding it cost more than the prefix break removing it (keep.sight)
	Refused        Code = "refused"         // store refused it
	Invalid        Code = "invalid"         // undecodable, unknown format
	TooLarge       Code = "too_large"       // over a byte or pixel limit
	FetchFailed    Code = "fetch_failed"    // a URL could not be fetched safely
	Document       Code = "document"        // documents travel as text only
)

// All lists every code, in the order of docs/design.md.
var All = []Code{
	Budget, Cap, Bytes, Truncated, NoVision, KeyOff, Unmeasured, BelowThreshold,
	Overflow, Idle, Compaction, ProviderLimit, Window, Priced, Refused, Invalid, TooLarge,
	FetchFailed, Document,
}

// Valid reports whether c is one of the codes in All.
func (c Code) Valid() bool {
	for _, k := range All {
		if c == k {
			return true
		}
	}
	return false
}

// Unseen reports whether c keeps something from the model that it was
// never shown: its marker says why, as the user would want the model to
// tell them. The other codes remove what the model has seen; their markers
// leave the code out, since a marker is read again on every later request
// (two tokens of six) and the code is in the count, the log and the metric.
func (c Code) Unseen() bool {
	switch c {
	case NoVision, Refused, Invalid, TooLarge, FetchFailed, Document:
		return true
	}
	return false
}

// Error is a refusal that carries a reason code. Packages that refuse
// untrusted input return it (or wrap it), so callers branch on the code with
// errors.As and gateways map it to a status without string matching.
type Error struct {
	Code Code   // why
	Msg  string // what, for a person; never contains the input's bytes
	Err  error  // the underlying cause, if any
}

func (e *Error) Error() string {
	s := string(e.Code) + ": " + e.Msg
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// New returns a refusal with code c and message msg.
func New(c Code, msg string) *Error { return &Error{Code: c, Msg: msg} }

// Wrap returns a refusal with code c and message msg caused by err.
func Wrap(c Code, msg string, err error) *Error { return &Error{Code: c, Msg: msg, Err: err} }

// Of returns the reason code carried by err, or "" when err carries none.
func Of(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}
