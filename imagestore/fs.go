package imagestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/imgctx/imgctx/blob"
)

// FS stores blobs as files under Root:
//
//	<Root>/<tenant>/<first 2 hex>/<remaining 62 hex>
//
// Each file is an 8-byte header (magic "ICB", format 1, CRC-32C of the
// payload) followed by the payload; docs/format.md has the details. The CRC
// catches storage corruption cheaply; that the bytes are the image the ref
// names is checked above, by Verified (or GCM, for sealed blobs). Writes go
// to a temp file in the same directory, are fsynced, read back and compared,
// then renamed into place, and the directory is fsynced: a crash never leaves
// a partial blob readable. Every read checks the header's digest.
type FS struct {
	Root string
	// Now is the clock used by Touch; nil means time.Now.
	Now func() time.Time
	// NoSync skips the fsyncs. A crash may then lose recent blobs, but never
	// exposes wrong bytes (the CRC refuses a torn file). For caches and
	// throwaway data directories only.
	NoSync bool

	// beforeRename, when set, runs between the verified temp write and the
	// rename; tests use it to simulate a crash at the worst moment.
	beforeRename func() error
}

var _ Store = (*FS)(nil)

const (
	fsMagic      = "ICB\x01"
	fsHeaderSize = len(fsMagic) + 4
	tmpPrefix    = ".tmp-"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewFS returns an FS rooted at root, creating the directory if needed.
func NewFS(root string) (*FS, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create image store: %w", err)
	}
	return &FS{Root: root}, nil
}

func (s *FS) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *FS) path(tenant string, ref blob.Ref) string {
	h := ref.Hex()
	return filepath.Join(s.Root, tenant, h[:2], h[2:])
}

// Put writes data durably under ref. When a valid blob is already there,
// Put only refreshes its date.
func (s *FS) Put(ctx context.Context, tenant string, ref blob.Ref, data []byte) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	final := s.path(tenant, ref)
	if existing, err := s.read(final); err == nil && bytes.Equal(existing, data) {
		return s.touchPath(final)
	}
	dir := filepath.Dir(final)
	if err := s.mkdirs(dir); err != nil {
		return fmt.Errorf("put %s: %w", ref, err)
	}
	file := Frame(data)
	tmp, err := writeTemp(dir, file, !s.NoSync)
	if err != nil {
		return fmt.Errorf("put %s: %w", ref, err)
	}
	defer os.Remove(tmp) // no-op after a successful rename
	if err := s.touchPath(tmp); err != nil {
		return fmt.Errorf("put %s: %w", ref, err)
	}
	if s.beforeRename != nil {
		if err := s.beforeRename(); err != nil {
			return fmt.Errorf("put %s: %w", ref, err)
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		return fmt.Errorf("put %s: %w", ref, err)
	}
	if s.NoSync {
		return nil
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("put %s: %w", ref, err)
	}
	return nil
}

// Frame returns data behind the 8-byte header every backend stores (magic
// "ICB", format 1, CRC-32C of data): the same bytes in a file or an object.
func Frame(data []byte) []byte {
	file := make([]byte, 0, FrameOverhead+len(data))
	file = append(file, fsMagic...)
	file = binary.BigEndian.AppendUint32(file, crc32.Checksum(data, castagnoli))
	return append(file, data...)
}

// FrameOverhead is what Frame adds to a blob's size.
const FrameOverhead = fsHeaderSize

// Unframe checks a framed blob's header and digest and returns its payload
// (aliasing file), or ErrCorrupt.
func Unframe(file []byte) ([]byte, error) {
	if len(file) < fsHeaderSize || string(file[:len(fsMagic)]) != fsMagic {
		return nil, fmt.Errorf("%w: bad header", ErrCorrupt)
	}
	payload := file[fsHeaderSize:]
	if crc32.Checksum(payload, castagnoli) != binary.BigEndian.Uint32(file[len(fsMagic):]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorrupt)
	}
	return payload, nil
}

// writeTemp writes file to a new temp file in dir, fsyncs it (when sync),
// reads it back and compares, and returns its path.
func writeTemp(dir string, file []byte, sync bool) (string, error) {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(dir, tmpPrefix+hex.EncodeToString(rnd[:]))
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	_, werr := f.Write(file)
	var serr error
	if sync {
		serr = f.Sync()
	}
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		os.Remove(tmp)
		return "", err
	}
	back, err := os.ReadFile(tmp)
	if err != nil || !bytes.Equal(back, file) {
		os.Remove(tmp)
		if err == nil {
			err = errors.New("read-back differs from what was written")
		}
		return "", fmt.Errorf("verify write: %w", err)
	}
	return tmp, nil
}

// mkdirs creates dir and its tenant parent, fsyncing each parent whose
// entries changed so the new directories survive a crash.
func (s *FS) mkdirs(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	tenantDir := filepath.Dir(dir)
	for _, d := range []string{tenantDir, dir} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := syncDir(filepath.Dir(d)); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	serr := d.Sync()
	return errors.Join(serr, d.Close())
}

// read returns the payload of a blob file after checking its header.
func (s *FS) read(path string) ([]byte, error) {
	file, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	return Unframe(file)
}

// Get returns the payload under ref, checked against its stored digest.
func (s *FS) Get(ctx context.Context, tenant string, ref blob.Ref) ([]byte, error) {
	if err := CheckArgs(tenant, ref); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	data, err := s.read(s.path(tenant, ref))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", ref, err)
	}
	return data, nil
}

// Stat describes the blob under ref from the file's metadata.
func (s *FS) Stat(_ context.Context, tenant string, ref blob.Ref) (Info, error) {
	if err := CheckArgs(tenant, ref); err != nil {
		return Info{}, err
	}
	fi, err := os.Stat(s.path(tenant, ref))
	if errors.Is(err, fs.ErrNotExist) {
		return Info{}, fmt.Errorf("stat %s: %w", ref, ErrNotFound)
	}
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", ref, err)
	}
	return fsInfo(ref, fi), nil
}

func fsInfo(ref blob.Ref, fi fs.FileInfo) Info {
	return Info{Ref: ref, Size: max(fi.Size()-int64(fsHeaderSize), 0), ModTime: fi.ModTime()}
}

// Touch sets the blob's modification time to now.
func (s *FS) Touch(_ context.Context, tenant string, ref blob.Ref) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	if err := s.touchPath(s.path(tenant, ref)); err != nil {
		return fmt.Errorf("touch %s: %w", ref, err)
	}
	return nil
}

func (s *FS) touchPath(path string) error {
	now := s.now()
	err := os.Chtimes(path, now, now)
	if errors.Is(err, fs.ErrNotExist) {
		return ErrNotFound
	}
	return err
}

// Delete removes the blob under ref.
func (s *FS) Delete(_ context.Context, tenant string, ref blob.Ref) error {
	if err := CheckArgs(tenant, ref); err != nil {
		return err
	}
	err := os.Remove(s.path(tenant, ref))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete %s: %w", ref, err)
	}
	return nil
}

// List walks the tenant's fan-out directories in order. Temp files and names
// that are not refs are skipped.
func (s *FS) List(ctx context.Context, tenant string, fn func(Info) error) error {
	if err := ValidTenant(tenant); err != nil {
		return err
	}
	tdir := filepath.Join(s.Root, tenant)
	fans, err := os.ReadDir(tdir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list: %w", err)
	}
	for _, fan := range fans {
		if !fan.IsDir() || len(fan.Name()) != 2 {
			continue
		}
		entries, err := os.ReadDir(filepath.Join(tdir, fan.Name()))
		if err != nil {
			return fmt.Errorf("list: %w", err)
		}
		for _, e := range entries {
			ref, err := blob.Parse(blob.Prefix + fan.Name() + e.Name())
			if err != nil || !e.Type().IsRegular() {
				continue
			}
			fi, err := e.Info()
			if errors.Is(err, fs.ErrNotExist) {
				continue // deleted while listing
			}
			if err != nil {
				return fmt.Errorf("list: %w", err)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := fn(fsInfo(ref, fi)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Tenants lists the tenants that have a directory in the store.
func (s *FS) Tenants() ([]string, error) {
	entries, err := os.ReadDir(s.Root)
	if err != nil {
		return nil, fmt.Errorf("list tenants: %w", err)
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && ValidTenant(e.Name()) == nil {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// RemoveStaleTemps deletes temp files left by interrupted writes that are
// older than cutoff, returning how many it removed.
func (s *FS) RemoveStaleTemps(cutoff time.Time) (int, error) {
	n := 0
	err := filepath.WalkDir(s.Root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || !strings.HasPrefix(d.Name(), tmpPrefix) {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if fi.ModTime().Before(cutoff) {
			if err := os.Remove(path); err == nil {
				n++
			}
		}
		return nil
	})
	return n, err
}
