// Package testsvc finds the servers the scale-out tests run against: a
// PostgreSQL server and an S3-compatible object store, started by
// scripts/testservices (which .ci/run calls) and named by environment
// variables. Outside CI a test without them skips and says how to start
// them; in CI (IMGCTXTEST_CI set) their absence fails the test.
package testsvc

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
	"testing"
)

// Environment variables scripts/testservices exports.
const (
	PostgresEnv = "IMGCTXTEST_POSTGRES" // a DSN with rights to create schemas
	S3Env       = "IMGCTXTEST_S3"       // endpoint,access key,secret key (http, path-style)
	CIEnv       = "IMGCTXTEST_CI"
)

const howTo = "start them with `eval \"$(scripts/testservices start)\"` (installs PostgreSQL from Debian and versitygw from the Go module proxy when missing)"

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
