// Package blob names content by its SHA-256 digest. A Ref is a comparable
// value, usable as a map key, whose string form says which hash it is:
// "sha256-" followed by 64 lowercase hex digits.
package blob

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Prefix starts the string form of every Ref.
const Prefix = "sha256-"

// Ref is the content address of an image or document: the SHA-256 of its
// decoded bytes. The zero Ref is invalid and means "no ref".
type Ref struct {
	digest [sha256.Size]byte
	valid  bool
}

// ErrInvalidRef is wrapped by every Parse error.
var ErrInvalidRef = errors.New("invalid ref")

// Of returns the Ref of data.
func Of(data []byte) Ref {
	return Ref{digest: sha256.Sum256(data), valid: true}
}

// Parse reads the string form "sha256-<64 lowercase hex>".
func Parse(s string) (Ref, error) {
	rest, ok := strings.CutPrefix(s, Prefix)
	if !ok {
		return Ref{}, fmt.Errorf("%w: %.80q does not start with %q", ErrInvalidRef, s, Prefix)
	}
	if len(rest) != 2*sha256.Size {
		return Ref{}, fmt.Errorf("%w: digest has %d characters, want %d", ErrInvalidRef, len(rest), 2*sha256.Size)
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		switch {
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		case 'A' <= c && c <= 'F':
			return Ref{}, fmt.Errorf("%w: digest must be lower case (character %d is %q)", ErrInvalidRef, i, c)
		default:
			return Ref{}, fmt.Errorf("%w: digest has a non-hex character at %d", ErrInvalidRef, i)
		}
	}
	var r Ref
	if _, err := hex.Decode(r.digest[:], []byte(rest)); err != nil {
		return Ref{}, fmt.Errorf("%w: %v", ErrInvalidRef, err)
	}
	r.valid = true
	return r, nil
}

// Valid reports whether r names a digest (the zero Ref does not).
func (r Ref) Valid() bool { return r.valid }

// Digest returns the raw SHA-256 digest.
func (r Ref) Digest() [sha256.Size]byte { return r.digest }

// Hex returns the 64 lowercase hex digits of the digest.
func (r Ref) Hex() string { return hex.EncodeToString(r.digest[:]) }

// String returns "sha256-<hex>", or "" for the zero Ref.
func (r Ref) String() string {
	if !r.valid {
		return ""
	}
	return Prefix + r.Hex()
}

// Matches reports whether data hashes to r.
func (r Ref) Matches(data []byte) bool { return r.valid && sha256.Sum256(data) == r.digest }

// MarshalText encodes r as its string form; the zero Ref encodes as "".
func (r Ref) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText parses the string form; "" gives the zero Ref.
func (r *Ref) UnmarshalText(b []byte) error {
	if len(b) == 0 {
		*r = Ref{}
		return nil
	}
	p, err := Parse(string(b))
	if err != nil {
		return err
	}
	*r = p
	return nil
}
