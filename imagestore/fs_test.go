package imagestore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	. "github.com/imgctx/imgctx/imagestore"
)

func TestFSLayoutAndHeader(t *testing.T) {
	dir := t.TempDir()
	fsys, _ := NewFS(dir)
	data := []byte("png bytes")
	ref, err := Put(context.Background(), Verified{fsys}, "t1", data)
	if err != nil {
		t.Fatal(err)
	}
	h := ref.Hex()
	file, err := os.ReadFile(filepath.Join(dir, "t1", h[:2], h[2:]))
	if err != nil {
		t.Fatalf("blob not at the documented path: %v", err)
	}
	want := binary.BigEndian.AppendUint32([]byte("ICB\x01"), crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)))
	want = append(want, data...)
	if !bytes.Equal(file, want) {
		t.Fatalf("file layout differs from docs/format.md:\n got %x\nwant %x", file, want)
	}
}

// Regression guard: a flipped bit on disk must never come back as bytes.
func TestFSCorruptionIsDetected(t *testing.T) {
	ctx := context.Background()
	cases := map[string]func([]byte) []byte{
		"payload bit flip": func(b []byte) []byte { b[len(b)-1] ^= 1; return b },
		"header magic":     func(b []byte) []byte { b[0] = 'X'; return b },
		"truncated":        func(b []byte) []byte { return b[:10] },
		"checksum":         func(b []byte) []byte { b[5] ^= 0x80; return b },
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			fsys, _ := NewFS(dir)
			s := Verified{fsys}
			ref, _ := Put(ctx, s, "t", []byte("an image payload"))
			path := filepath.Join(dir, "t", ref.Hex()[:2], ref.Hex()[2:])
			b, _ := os.ReadFile(path)
			os.WriteFile(path, damage(b), 0o600)
			if _, err := s.Get(ctx, "t", ref); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("got %v; want ErrCorrupt", err)
			}
			st, err := Verify(ctx, s, "t", nil, nil)
			if err != nil || st.Checked != 1 || len(st.Corrupt) != 1 || st.Corrupt[0] != ref {
				t.Fatalf("verify: %+v, %v", st, err)
			}
			// A fresh put of the same image repairs it.
			if _, err := Put(ctx, s, "t", []byte("an image payload")); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Get(ctx, "t", ref); err != nil {
				t.Fatalf("put did not repair a corrupt blob: %v", err)
			}
		})
	}
}

func TestFSStaleTempsAreCleanedNotListed(t *testing.T) {
	dir := t.TempDir()
	fsys, _ := NewFS(dir)
	SetBeforeRename(fsys, func() error { return errCrash })
	// A crash that left its temp file behind (os.Remove in Put's defer is
	// what a real crash skips): recreate one by hand.
	os.MkdirAll(filepath.Join(dir, "t", "ab"), 0o700)
	tmp := filepath.Join(dir, "t", "ab", ".tmp-0123456789abcdef")
	os.WriteFile(tmp, []byte("partial"), 0o600)
	old := time.Now().Add(-2 * time.Hour)
	os.Chtimes(tmp, old, old)
	n := 0
	fsys.List(context.Background(), "t", func(Info) error { n++; return nil })
	if n != 0 {
		t.Fatalf("a temp file was listed as a blob")
	}
	removed, err := fsys.RemoveStaleTemps(time.Now().Add(-time.Hour))
	if err != nil || removed != 1 {
		t.Fatalf("removed %d stale temps, %v; want 1", removed, err)
	}
	if _, err := os.Stat(tmp); !os.IsNotExist(err) {
		t.Fatal("stale temp file still there")
	}
}

func TestFSTenants(t *testing.T) {
	ctx := context.Background()
	fsys, _ := NewFS(t.TempDir())
	for _, ten := range []string{"b", "a"} {
		if _, err := Put(ctx, fsys, ten, []byte(ten)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := fsys.Tenants()
	if err != nil || len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("tenants %v, %v", got, err)
	}
}

func TestEncryptedAtRest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	fsys, _ := NewFS(dir)
	enc, err := NewEncrypted(fsys, Key{Version: 1, Master: testKey(1)})
	if err != nil {
		t.Fatal(err)
	}
	s := Verified{enc}
	secret := bytes.Repeat([]byte("SECRET-SCREENSHOT "), 50)
	ref, err := Put(ctx, s, "t", secret)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "t", ref.Hex()[:2], ref.Hex()[2:])
	raw, _ := os.ReadFile(path)
	if bytes.Contains(raw, []byte("SECRET")) {
		t.Fatal("plaintext visible on disk")
	}

	t.Run("tampered ciphertext is an error", func(t *testing.T) {
		sealed, _ := fsys.Get(ctx, "t", ref)
		sealed[20] ^= 1
		// Rewrite through FS so its own checksum is valid: only GCM can catch it.
		if err := fsys.Put(ctx, "t", ref, sealed); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "t", ref); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("got %v; want ErrCorrupt", err)
		}
		if _, err := Put(ctx, s, "t", secret); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("wrong key is an error", func(t *testing.T) {
		other, _ := NewEncrypted(fsys, Key{Version: 1, Master: testKey(2)})
		if _, err := (Verified{other}).Get(ctx, "t", ref); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("got %v; want ErrCorrupt", err)
		}
	})

	t.Run("a blob moved under another ref does not open", func(t *testing.T) {
		sealed, _ := fsys.Get(ctx, "t", ref)
		moved := blob.Of([]byte("other"))
		fsys.Put(ctx, "t", moved, sealed)
		if _, err := s.Get(ctx, "t", moved); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("got %v; want ErrCorrupt", err)
		}
	})

	t.Run("rotation: new key writes, old key still reads", func(t *testing.T) {
		rotated, err := NewEncrypted(fsys, Key{Version: 2, Master: testKey(3)}, Key{Version: 1, Master: testKey(1)})
		if err != nil {
			t.Fatal(err)
		}
		rs := Verified{rotated}
		if got, err := rs.Get(ctx, "t", ref); err != nil || !bytes.Equal(got, secret) {
			t.Fatalf("old blob under rotated keys: %v", err)
		}
		fresh, err := Put(ctx, rs, "t", []byte("new image"))
		if err != nil {
			t.Fatal(err)
		}
		sealed, _ := fsys.Get(ctx, "t", fresh)
		if sealed[0] != 2 {
			t.Fatalf("new blob sealed with key version %d; want 2", sealed[0])
		}
		if _, err := s.Get(ctx, "t", fresh); !errors.Is(err, ErrUnknownKey) {
			t.Fatalf("old-key store reading a v2 blob: got %v; want ErrUnknownKey", err)
		}
	})

	t.Run("bad keys are refused", func(t *testing.T) {
		if _, err := NewEncrypted(fsys, Key{Version: 1, Master: []byte("short")}); err == nil {
			t.Fatal("short key accepted")
		}
		if _, err := NewEncrypted(fsys, Key{Version: 1, Master: testKey(1)}, Key{Version: 1, Master: testKey(2)}); err == nil {
			t.Fatal("duplicate key version accepted")
		}
	})
}

func TestParseAndReadKey(t *testing.T) {
	k := testKey(5)
	forms := map[string][]byte{
		"hex":    []byte("  " + "0506070809" + "0a0b0c0d0e0f101112131415161718191a1b1c1d1e1f2021222324" + "\n"),
		"raw":    k,
		"base64": []byte("BQYHCAkKCwwNDg8QERITFBUWFxgZGhscHR4fICEiIyQ=\n"),
	}
	for name, in := range forms {
		got, err := ParseKey(in)
		if err != nil || !bytes.Equal(got, k) {
			t.Fatalf("%s: got %x, %v", name, got, err)
		}
	}
	if _, err := ParseKey([]byte("too short")); err == nil {
		t.Fatal("short key accepted")
	}
	dir := t.TempDir()
	loose := filepath.Join(dir, "loose.key")
	os.WriteFile(loose, forms["hex"], 0o644)
	if _, err := ReadKeyFile(loose); err == nil {
		t.Fatal("world-readable key file accepted")
	}
	tight := filepath.Join(dir, "tight.key")
	os.WriteFile(tight, forms["hex"], 0o600)
	if got, err := ReadKeyFile(tight); err != nil || !bytes.Equal(got, k) {
		t.Fatalf("key file: %v", err)
	}
}

// Regression (issue "Hardening", item 13): verify stopped at the first
// blob sealed with an unknown key version and listed none of the corrupt
// ones. It reports both kinds and goes on.
func TestVerifyGoesOnPastUnknownKeys(t *testing.T) {
	ctx := context.Background()
	mem := &Mem{}
	v1, _ := NewEncrypted(mem, Key{Version: 1, Master: testKey(1)})
	a, b := []byte("\x89PNG first image bytes....................."), []byte("\x89PNG second image bytes...................")
	v1.Put(ctx, "t", blob.Of(a), a)
	v1.Put(ctx, "t", blob.Of(b), b)
	v2, _ := NewEncrypted(mem, Key{Version: 2, Master: testKey(2)})
	c := []byte("\x89PNG third image bytes......................")
	v2.Put(ctx, "t", blob.Of(c), c)
	// The store now knows only key 2: a and b are sealed with a key it lacks.
	st, err := Verify(ctx, Verified{v2}, "t", nil, nil)
	if err != nil || st.Checked != 3 || len(st.Sealed) != 2 || len(st.Corrupt) != 0 {
		t.Fatalf("verify: %+v, %v; want 3 checked, 2 sealed with an unknown key", st, err)
	}
}
