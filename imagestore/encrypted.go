package imagestore

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/imgctx/imgctx/blob"
)

// Key is a 32-byte master key and the version byte that names it in sealed
// blobs. Rotating keys means adding a new current Key and keeping the old
// ones for reading.
type Key struct {
	Version byte
	Master  []byte
}

// ErrUnknownKey is returned when a sealed blob names a key version the store
// was not given.
var ErrUnknownKey = errors.New("blob sealed with an unknown key version")

// Encrypted seals every blob with AES-256-GCM before handing it to the inner
// store. Each blob's key is derived with HKDF-SHA256 from the master key and
// the ref, and the ref is the GCM additional data, so a blob moved under
// another ref, tampered with, or read with the wrong key fails to open: an
// error, never garbage. Sealed layout: version byte, 12-byte nonce,
// ciphertext and 16-byte tag (docs/format.md).
type Encrypted struct {
	inner   Store
	current Key
	keys    map[byte][]byte
}

var _ Store = (*Encrypted)(nil)

const sealOverhead = 1 + 12 + 16

// NewEncrypted wraps inner. current seals new blobs; older keys only open.
func NewEncrypted(inner Store, current Key, older ...Key) (*Encrypted, error) {
	e := &Encrypted{inner: inner, current: current, keys: map[byte][]byte{}}
	for _, k := range append([]Key{current}, older...) {
		if len(k.Master) != 32 {
			return nil, fmt.Errorf("key version %d: master key must be 32 bytes, got %d", k.Version, len(k.Master))
		}
		if _, dup := e.keys[k.Version]; dup {
			return nil, fmt.Errorf("key version %d given twice", k.Version)
		}
		e.keys[k.Version] = k.Master
	}
	return e, nil
}

func blobAEAD(master []byte, ref blob.Ref) (cipher.AEAD, error) {
	key, err := hkdf.Key(sha256.New, master, nil, "imgctx blob key v1 "+ref.String(), 32)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func (e *Encrypted) seal(ref blob.Ref, plain []byte) ([]byte, error) {
	aead, err := blobAEAD(e.current.Master, ref)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 1+aead.NonceSize(), sealOverhead+len(plain))
	out[0] = e.current.Version
	if _, err := rand.Read(out[1:]); err != nil {
		return nil, err
	}
	return aead.Seal(out, out[1:], plain, []byte(ref.String())), nil
}

func (e *Encrypted) open(ref blob.Ref, sealed []byte) ([]byte, error) {
	if len(sealed) < sealOverhead {
		return nil, fmt.Errorf("%w: sealed blob too short", ErrCorrupt)
	}
	master, ok := e.keys[sealed[0]]
	if !ok {
		return nil, fmt.Errorf("%w: version %d", ErrUnknownKey, sealed[0])
	}
	aead, err := blobAEAD(master, ref)
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, sealed[1:13], sealed[13:], []byte(ref.String()))
	if err != nil {
		return nil, fmt.Errorf("%w: authentication failed (tampered, moved, or wrong key)", ErrCorrupt)
	}
	return plain, nil
}

// Put seals data and stores it; an identical blob already stored is only touched.
func (e *Encrypted) Put(ctx context.Context, tenant string, ref blob.Ref, data []byte) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	if sealed, err := e.inner.Get(ctx, tenant, ref); err == nil && sealed[0] == e.current.Version {
		if plain, err := e.open(ref, sealed); err == nil && bytes.Equal(plain, data) {
			return e.inner.Touch(ctx, tenant, ref)
		}
	}
	sealed, err := e.seal(ref, data)
	if err != nil {
		return fmt.Errorf("seal %s: %w", ref, err)
	}
	return e.inner.Put(ctx, tenant, ref, sealed)
}

// Get opens the sealed blob under ref.
func (e *Encrypted) Get(ctx context.Context, tenant string, ref blob.Ref) ([]byte, error) {
	sealed, err := e.inner.Get(ctx, tenant, ref)
	if err != nil {
		return nil, err
	}
	plain, err := e.open(ref, sealed)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", ref, err)
	}
	return plain, nil
}

// Stat reports the plaintext size.
func (e *Encrypted) Stat(ctx context.Context, tenant string, ref blob.Ref) (Info, error) {
	in, err := e.inner.Stat(ctx, tenant, ref)
	in.Size = max(in.Size-sealOverhead, 0)
	return in, err
}

func (e *Encrypted) Touch(ctx context.Context, tenant string, ref blob.Ref) error {
	return e.inner.Touch(ctx, tenant, ref)
}

func (e *Encrypted) Delete(ctx context.Context, tenant string, ref blob.Ref) error {
	return e.inner.Delete(ctx, tenant, ref)
}

// List reports plaintext sizes.
func (e *Encrypted) List(ctx context.Context, tenant string, fn func(Info) error) error {
	return e.inner.List(ctx, tenant, func(in Info) error {
		in.Size = max(in.Size-sealOverhead, 0)
		return fn(in)
	})
}

// ParseKey reads a 32-byte master key written as 64 hex digits, as standard
// base64, or as 32 raw bytes; surrounding white space is ignored.
func ParseKey(b []byte) ([]byte, error) {
	s := strings.TrimSpace(string(b))
	if k, err := hex.DecodeString(s); err == nil && len(k) == 32 {
		return k, nil
	}
	if k, err := base64.StdEncoding.DecodeString(s); err == nil && len(k) == 32 {
		return k, nil
	}
	if len(b) == 32 {
		return bytes.Clone(b), nil
	}
	return nil, errors.New("master key must be 32 bytes: 64 hex digits, base64, or raw")
}

// ReadKeyFile reads a master key with ParseKey, refusing a file that others
// can read.
func ReadKeyFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("read key file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("read key file %s: permissions %v let others read it; chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read key file: %w", err)
	}
	k, err := ParseKey(b)
	if err != nil {
		return nil, fmt.Errorf("read key file %s: %w", path, err)
	}
	return k, nil
}

// Stack builds the usual decorators on a backend: Verified outermost, with
// Encrypted below it when master is not nil.
func Stack(backend Store, master []byte) (Store, error) {
	s := backend
	if master != nil {
		enc, err := NewEncrypted(backend, Key{Version: 1, Master: master})
		if err != nil {
			return nil, err
		}
		s = enc
	}
	return Verified{s}, nil
}
