// Package testsvc finds the servers the scale-out tests run against — a
// PostgreSQL server and an S3-compatible object store — and the browser
// the dashboard's test drives, started or installed by
// scripts/testservices (which .ci/run calls) and named by environment
// variables. Outside CI a test without them skips and says how to start
// them; in CI (IMGCTXTEST_CI set) their absence fails the test.
package testsvc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Environment variables scripts/testservices exports.
const (
	PostgresEnv = "IMGCTXTEST_POSTGRES" // a DSN with rights to create schemas
	S3Env       = "IMGCTXTEST_S3"       // endpoint,access key,secret key (http, path-style)
	CIEnv       = "IMGCTXTEST_CI"
	ChromiumEnv = "IMGCTXTEST_CHROMIUM" // a headless-capable Chromium binary
	HAProxyEnv  = "IMGCTXTEST_HAPROXY"  // the haproxy binary docs/deploy.md's configuration is tested with
)

// HAProxy returns the load balancer's binary, or skips.
func HAProxy(t testing.TB) string {
	t.Helper()
	return binary(t, "HAProxy load balancer", HAProxyEnv)
}

// Chromium returns the browser binary, or skips.
func Chromium(t testing.TB) string {
	t.Helper()
	return binary(t, "Chromium browser", ChromiumEnv)
}

// binary is the path env names, or a skip (a failure in CI).
func binary(t testing.TB, what, env string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		missing(t, what, env)
	}
	return path
}

const howTo = "start them with `eval \"$(scripts/testservices start)\"` (installs PostgreSQL, Chromium and HAProxy from Debian and versitygw from the Go module proxy when missing)"

func missing(t testing.TB, what, env string) {
	t.Helper()
	if os.Getenv(CIEnv) != "" {
		t.Fatalf("%s is not set: CI must run this test against a real %s", env, what)
	}
	t.Skipf("no %s: %s is not set; %s", what, env, howTo)
}

// Postgres returns the DSN of the test server, or skips.
func Postgres(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(PostgresEnv)
	if dsn == "" {
		missing(t, "PostgreSQL server", PostgresEnv)
	}
	return dsn
}

// S3 is an S3-compatible server's endpoint and credentials.
type S3 struct {
	Endpoint, AccessKey, SecretKey string
}

// ObjectStore returns the test S3 server, or skips.
func ObjectStore(t testing.TB) S3 {
	t.Helper()
	v := os.Getenv(S3Env)
	if v == "" {
		missing(t, "S3-compatible server", S3Env)
	}
	f := strings.SplitN(v, ",", 3)
	if len(f) != 3 {
		t.Fatalf("%s=%q: want endpoint,access key,secret key", S3Env, v)
	}
	return S3{f[0], f[1], f[2]}
}

// Name returns a fresh lower-case name with prefix, for a schema or a
// bucket of one test.
func Name(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// Schema returns a DSN of the test server whose tables live in a new
// schema, dropped when the test ends: tests share one server and never see
// each other's rows.
func Schema(t testing.TB) string {
	t.Helper()
	dsn := Postgres(t)
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect to the test PostgreSQL server: %v", err)
	}
	schema := Name("t_")
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
		admin.Close(context.Background())
	})
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + "search_path=" + schema
}

// Client returns a minio client of the test server, for set-up and for
// looking behind a store's back.
func (s S3) Client(t testing.TB) *minio.Client {
	t.Helper()
	u, err := url.Parse(s.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	c, err := minio.New(u.Host, &minio.Options{Creds: credentials.NewStaticV4(s.AccessKey, s.SecretKey, ""), Secure: u.Scheme == "https"})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// Bucket makes a new bucket on the test server, emptied and removed when
// the test ends, and returns the server and the bucket's name.
func Bucket(t testing.TB) (S3, string) {
	t.Helper()
	srv := ObjectStore(t)
	c := srv.Client(t)
	name := Name("imgctx-")
	if err := c.MakeBucket(context.Background(), name, minio.MakeBucketOptions{}); err != nil {
		t.Fatalf("make bucket: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for o := range c.ListObjects(ctx, name, minio.ListObjectsOptions{Recursive: true}) {
			c.RemoveObject(ctx, name, o.Key, minio.RemoveObjectOptions{})
		}
		c.RemoveBucket(ctx, name)
	})
	return srv, name
}
