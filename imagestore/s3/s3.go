// Package s3 keeps blobs in an S3-compatible object store (AWS S3, MinIO,
// versitygw, Ceph RGW …) through minio-go, for gateway replicas that share
// their images:
//
//	<bucket>/<prefix><tenant>/<64 hex digits of the ref>
//
// Each object holds the same framed bytes as a file of the FS store (an
// 8-byte header with a CRC-32C of the payload, docs/format.md), so a torn or
// altered object is ErrCorrupt, never wrong bytes. Its last-touch time is
// user metadata (x-amz-meta-touched, unix nanoseconds from the store's
// clock) rather than the server's Last-Modified, so GC cutoffs mean the same
// thing on every backend; Touch rewrites it with a server-side copy.
package s3

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Config names the bucket and how to reach it.
type Config struct {
	// Endpoint is the server's URL: https://s3.eu-west-1.amazonaws.com,
	// http://127.0.0.1:7070. The scheme chooses TLS.
	Endpoint  string
	Bucket    string
	Prefix    string // put before every key, e.g. "imgctx/"; may be empty
	Region    string // empty: the server's default
	AccessKey string
	SecretKey string
}

// Store is an imagestore.Store in one bucket.
type Store struct {
	c      *minio.Client
	bucket string
	prefix string
	// Now is the clock of Put and Touch; nil means time.Now.
	Now func() time.Time
}

var _ imagestore.Store = (*Store)(nil)

const (
	metaTouched = "Touched" // x-amz-meta-touched
	metaCRC     = "Crc32c"  // x-amz-meta-crc32c: of the payload, hex
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Open connects and checks that the bucket exists and the credentials may
// read it, so a wrong setting fails at start. Errors never carry the
// secret key.
func Open(ctx context.Context, cfg Config) (*Store, error) {
	u, err := url.Parse(cfg.Endpoint)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return nil, fmt.Errorf("image store: endpoint %q: want http://host:port or https://host", cfg.Endpoint)
	}
	if u.Path != "" && u.Path != "/" {
		return nil, fmt.Errorf("image store: endpoint %q: a path is not allowed; put it in the prefix", cfg.Endpoint)
	}
	if cfg.Bucket == "" {
		return nil, errors.New("image store: no bucket set (storage.s3.bucket)")
	}
	if cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, ""),
		Secure: u.Scheme == "https",
		Region: cfg.Region,
	})
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	ok, err := c.BucketExists(ctx, cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("image store: bucket %q at %s: %s", cfg.Bucket, u.Host, describe(err))
	}
	if !ok {
		return nil, fmt.Errorf("image store: bucket %q does not exist at %s; create it first", cfg.Bucket, u.Host)
	}
	return &Store{c: c, bucket: cfg.Bucket, prefix: cfg.Prefix}, nil
}

// describe keeps an S3 error's code and message, which carry no secret.
func describe(err error) string {
	if r := minio.ToErrorResponse(err); r.Code != "" {
		return r.Code + ": " + r.Message
	}
	return err.Error()
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Store) key(tenant string, ref blob.Ref) string {
	return s.prefix + tenant + "/" + ref.Hex()
}

func notFound(err error) bool {
	code := minio.ToErrorResponse(err).Code
	return code == "NoSuchKey" || code == "NotFound"
}

func (s *Store) meta(crc uint32) map[string]string {
	return map[string]string{
		metaTouched: strconv.FormatInt(s.now().UnixNano(), 10),
		metaCRC:     strconv.FormatUint(uint64(crc), 16),
	}
}

func check(ctx context.Context, tenant string, ref blob.Ref) error {
	if err := imagestore.CheckArgs(tenant, ref); err != nil {
		return err
	}
	return ctx.Err()
}

// Put uploads the framed bytes in one request (S3 makes an object visible
// whole or not at all). When the same bytes are already there, it only
// refreshes their date, without uploading them again.
func (s *Store) Put(ctx context.Context, tenant string, ref blob.Ref, data []byte) error {
	if err := check(ctx, tenant, ref); err != nil {
		return err
	}
	crc := crc32.Checksum(data, castagnoli)
	k := s.key(tenant, ref)
	if in, err := s.c.StatObject(ctx, s.bucket, k, minio.StatObjectOptions{}); err == nil &&
		in.Size == int64(len(data)+imagestore.FrameOverhead) && in.UserMetadata[metaCRC] == strconv.FormatUint(uint64(crc), 16) {
		return s.touch(ctx, k, crc)
	}
	file := imagestore.Frame(data)
	_, err := s.c.PutObject(ctx, s.bucket, k, bytes.NewReader(file), int64(len(file)), minio.PutObjectOptions{
		UserMetadata: s.meta(crc), ContentType: "application/octet-stream", DisableMultipart: true, SendContentMd5: true})
	if err != nil {
		return fmt.Errorf("put %s: %s", ref, describe(err))
	}
	return nil
}

// Get reads the object and checks its frame.
func (s *Store) Get(ctx context.Context, tenant string, ref blob.Ref) ([]byte, error) {
	if err := check(ctx, tenant, ref); err != nil {
		return nil, err
	}
	obj, err := s.c.GetObject(ctx, s.bucket, s.key(tenant, ref), minio.GetObjectOptions{})
	if err != nil {
		return nil, fmt.Errorf("get %s: %s", ref, describe(err))
	}
	defer obj.Close()
	file, err := io.ReadAll(obj)
	if notFound(err) {
		return nil, fmt.Errorf("get %s: %w", ref, imagestore.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get %s: %s", ref, describe(err))
	}
	data, err := imagestore.Unframe(file)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", ref, err)
	}
	return data, nil
}

func (s *Store) stat(ctx context.Context, tenant string, ref blob.Ref) (imagestore.Info, uint32, error) {
	in, err := s.c.StatObject(ctx, s.bucket, s.key(tenant, ref), minio.StatObjectOptions{})
	if notFound(err) {
		return imagestore.Info{}, 0, fmt.Errorf("stat %s: %w", ref, imagestore.ErrNotFound)
	}
	if err != nil {
		return imagestore.Info{}, 0, fmt.Errorf("stat %s: %s", ref, describe(err))
	}
	return info(ref, in), parseCRC(in.UserMetadata[metaCRC]), nil
}

func info(ref blob.Ref, in minio.ObjectInfo) imagestore.Info {
	at := in.LastModified
	if ns, err := strconv.ParseInt(in.UserMetadata[metaTouched], 10, 64); err == nil {
		at = time.Unix(0, ns)
	}
	return imagestore.Info{Ref: ref, Size: max(in.Size-int64(imagestore.FrameOverhead), 0), ModTime: at}
}

func parseCRC(s string) uint32 {
	v, _ := strconv.ParseUint(s, 16, 32)
	return uint32(v)
}

// Stat reads the object's size and touch time with one HEAD request.
func (s *Store) Stat(ctx context.Context, tenant string, ref blob.Ref) (imagestore.Info, error) {
	if err := check(ctx, tenant, ref); err != nil {
		return imagestore.Info{}, err
	}
	in, _, err := s.stat(ctx, tenant, ref)
	return in, err
}

// Touch rewrites the object's touch time with a server-side copy onto
// itself: no bytes travel.
func (s *Store) Touch(ctx context.Context, tenant string, ref blob.Ref) error {
	if err := check(ctx, tenant, ref); err != nil {
		return err
	}
	_, crc, err := s.stat(ctx, tenant, ref)
	if err != nil {
		return err
	}
	return s.touch(ctx, s.key(tenant, ref), crc)
}

func (s *Store) touch(ctx context.Context, k string, crc uint32) error {
	_, err := s.c.CopyObject(ctx,
		minio.CopyDestOptions{Bucket: s.bucket, Object: k, UserMetadata: s.meta(crc), ReplaceMetadata: true},
		minio.CopySrcOptions{Bucket: s.bucket, Object: k})
	if notFound(err) {
		return fmt.Errorf("touch %s: %w", k, imagestore.ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("touch %s: %s", k, describe(err))
	}
	return nil
}

// Delete removes the object; S3 answers a missing one with success too.
func (s *Store) Delete(ctx context.Context, tenant string, ref blob.Ref) error {
	if err := check(ctx, tenant, ref); err != nil {
		return err
	}
	if err := s.c.RemoveObject(ctx, s.bucket, s.key(tenant, ref), minio.RemoveObjectOptions{}); err != nil && !notFound(err) {
		return fmt.Errorf("delete %s: %s", ref, describe(err))
	}
	return nil
}

// List pages through the tenant's keys, which S3 returns in byte order,
// that is ref order. Listings carry no user metadata, so each blob's touch
// time costs a HEAD: List serves GC and verification, not requests.
func (s *Store) List(ctx context.Context, tenant string, fn func(imagestore.Info) error) error {
	if err := imagestore.ValidTenant(tenant); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // stops the listing goroutine when fn stops early
	prefix := s.prefix + tenant + "/"
	for obj := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if obj.Err != nil {
			return fmt.Errorf("list: %s", describe(obj.Err))
		}
		ref, err := blob.Parse(blob.Prefix + strings.TrimPrefix(obj.Key, prefix))
		if err != nil {
			continue // not a blob of ours
		}
		in, _, err := s.stat(ctx, tenant, ref)
		if errors.Is(err, imagestore.ErrNotFound) {
			continue // deleted since the listing
		}
		if err != nil {
			return err
		}
		if err := fn(in); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// Tenants lists the tenants that have blobs, from the key prefixes.
func (s *Store) Tenants(ctx context.Context) ([]string, error) {
	var out []string
	for obj := range s.c.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix}) {
		if obj.Err != nil {
			return nil, fmt.Errorf("list tenants: %s", describe(obj.Err))
		}
		t, ok := strings.CutSuffix(strings.TrimPrefix(obj.Key, s.prefix), "/")
		if ok && imagestore.ValidTenant(t) == nil {
			out = append(out, t)
		}
	}
	return out, nil
}
