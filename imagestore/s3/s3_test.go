package s3

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/imgctx/imgctx/imagestore/storetest"
	"github.com/imgctx/imgctx/internal/testsvc"
	"github.com/minio/minio-go/v7"
)

func freshBucket(t *testing.T) Config {
	srv, bucket := testsvc.Bucket(t)
	return Config{Endpoint: srv.Endpoint, Bucket: bucket, Prefix: "images", AccessKey: srv.AccessKey, SecretKey: srv.SecretKey}
}

func client(t *testing.T, cfg Config) *minio.Client {
	return testsvc.S3{Endpoint: cfg.Endpoint, AccessKey: cfg.AccessKey, SecretKey: cfg.SecretKey}.Client(t)
}

func open(t *testing.T, cfg Config, now func() time.Time) *Store {
	t.Helper()
	s, err := Open(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Now = now
	return s
}

func harness(wrap func(imagestore.Store) imagestore.Store) storetest.Harness {
	var cfg Config
	return storetest.Harness{
		New: func(t *testing.T, now func() time.Time) imagestore.Store {
			cfg = freshBucket(t)
			return imagestore.Verified{Store: wrap(open(t, cfg, now))}
		},
		Reopen: func(t *testing.T) imagestore.Store { return imagestore.Verified{Store: wrap(open(t, cfg, nil))} },
	}
}

func TestConformanceS3(t *testing.T) {
	storetest.Run(t, harness(func(s imagestore.Store) imagestore.Store { return s }))
}

func TestConformanceEncryptedS3(t *testing.T) {
	key := bytes.Repeat([]byte{7}, 32)
	storetest.Run(t, harness(func(s imagestore.Store) imagestore.Store {
		e, err := imagestore.NewEncrypted(s, imagestore.Key{Version: 1, Master: key})
		if err != nil {
			panic(err)
		}
		return e
	}))
}

// The object is the framed blob under prefix/tenant/hex; altering a byte
// in the bucket makes Get answer ErrCorrupt, not the altered bytes.
func TestS3LayoutAndCorruption(t *testing.T) {
	cfg := freshBucket(t)
	s := open(t, cfg, nil)
	ctx := context.Background()
	data := []byte("\x89PNG not really, but bytes")
	ref := blob.Of(data)
	err := imagestore.PutComputed(ctx, imagestore.Verified{Store: s}, "alpha", ref, data)
	if err != nil {
		t.Fatal(err)
	}
	c := client(t, cfg)
	key := "images/alpha/" + ref.Hex()
	obj, err := c.GetObject(ctx, cfg.Bucket, key, minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var raw bytes.Buffer
	raw.ReadFrom(obj)
	obj.Close()
	if !bytes.Equal(raw.Bytes(), imagestore.Frame(data)) {
		t.Fatalf("object %s holds %q; want the framed blob", key, raw.Bytes())
	}
	bad := bytes.Clone(raw.Bytes())
	bad[len(bad)-1] ^= 1
	if _, err := c.PutObject(ctx, cfg.Bucket, key, bytes.NewReader(bad), int64(len(bad)), minio.PutObjectOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Get(ctx, "alpha", ref); !errors.Is(err, imagestore.ErrCorrupt) {
		t.Fatalf("altered object: got %q, %v; want ErrCorrupt", got, err)
	}
	// A foreign key under the tenant's prefix is not listed as a blob.
	c.PutObject(ctx, cfg.Bucket, "images/alpha/notes.txt", strings.NewReader("x"), 1, minio.PutObjectOptions{})
	var refs []blob.Ref
	s.List(ctx, "alpha", func(in imagestore.Info) error { refs = append(refs, in.Ref); return nil })
	if len(refs) != 1 || refs[0] != ref {
		t.Fatalf("listed %v; want only %v", refs, ref)
	}
}

func TestS3WrongSettingsFailAtOpen(t *testing.T) {
	cfg := freshBucket(t)
	for name, c := range map[string]Config{
		"bad secret":    {Endpoint: cfg.Endpoint, Bucket: cfg.Bucket, AccessKey: cfg.AccessKey, SecretKey: "wrong-secret-value"},
		"no scheme":     {Endpoint: strings.TrimPrefix(cfg.Endpoint, "http://"), Bucket: cfg.Bucket},
		"no bucket":     {Endpoint: cfg.Endpoint, AccessKey: cfg.AccessKey, SecretKey: cfg.SecretKey},
		"missing":       {Endpoint: cfg.Endpoint, Bucket: cfg.Bucket + "-missing", AccessKey: cfg.AccessKey, SecretKey: cfg.SecretKey},
		"endpoint path": {Endpoint: cfg.Endpoint + "/bucket", Bucket: cfg.Bucket},
	} {
		_, err := Open(context.Background(), c)
		if err == nil {
			t.Fatalf("%s: opened", name)
		}
		if strings.Contains(err.Error(), "wrong-secret-value") || strings.Contains(err.Error(), cfg.SecretKey) {
			t.Fatalf("%s: the error carries the secret: %v", name, err)
		}
		t.Logf("%s: %v", name, err)
	}
}
