// Package sqlite is the embedded session store: one SQLite file (pure Go
// driver, no cgo), WAL journal, migrations embedded in the binary.
package sqlite

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is a session.Store in one SQLite file.
type Store struct {
	db *sql.DB
	// proxied writes the decisions of proxied conversations without an
	// fsync per commit (WAL, synchronous NORMAL): durable across a crash of
	// the process, and one write per proxied request does not cap the
	// gateway at the disk's fsync rate. A power loss may lose the last
	// few, which costs a measurement, never a message.
	proxied *sql.DB
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// migrated are the migrations this Open applied.
	migrated []int
}

var _ session.Store = (*Store)(nil)

// Migrated returns the versions of the migrations Open applied (none when
// the schema was current).
func (s *Store) Migrated() []int { return s.migrated }

// Open opens (creating if needed) the database at path and applies any
// migration it has not seen.
func Open(path string) (*Store, error) {
	// temp_store(MEMORY): a statement writing several rows (the request
	// log's 16 a statement) keeps its statement journal in memory, not in a
	// temporary file written page by page.
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=synchronous(FULL)&_pragma=temp_store(MEMORY)&_txlock=immediate"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open session database: %w", err)
	}
	applied, err := migrate(db)
	if err != nil {
		db.Close()
		return nil, err
	}
	// Sessions hold conversations: readable by the owner only, like the images.
	for _, f := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(f, 0o600); err != nil && !errors.Is(err, fs.ErrNotExist) {
			db.Close()
			return nil, fmt.Errorf("session database: %w", err)
		}
	}
	fast, err := sql.Open("sqlite", strings.Replace(dsn, "synchronous(FULL)", "synchronous(NORMAL)", 1))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open session database: %w", err)
	}
	return &Store{db: db, proxied: fast, migrated: applied}, nil
}

// migrate applies the migrations the database has not seen and returns
// their versions.
func migrate(db *sql.DB) (applied []int, _ error) {
	if _, err := db.Exec(`CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	for _, f := range files {
		v, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f, "migrations/"), "_", 2)[0])
		if err != nil {
			return applied, fmt.Errorf("migration %s: bad name", f)
		}
		var seen int
		if err := db.QueryRow(`SELECT COUNT(*) FROM schema_migrations WHERE version = ?`, v).Scan(&seen); err != nil {
			return applied, fmt.Errorf("migrate: %w", err)
		}
		if seen > 0 {
			continue
		}
		body, _ := migrations.ReadFile(f)
		tx, err := db.Begin()
		if err != nil {
			return applied, fmt.Errorf("migrate: %w", err)
		}
		if _, err := tx.Exec(string(body)); err != nil {
			tx.Rollback()
			return applied, fmt.Errorf("migration %s: %w", f, err)
		}
		if _, err := tx.Exec(`INSERT INTO schema_migrations (version) VALUES (?)`, v); err != nil {
			tx.Rollback()
			return applied, fmt.Errorf("migration %s: %w", f, err)
		}
		if err := tx.Commit(); err != nil {
			return applied, fmt.Errorf("migration %s: %w", f, err)
		}
		applied = append(applied, v)
	}
	return applied, nil
}

func (s *Store) now() time.Time {
	if s.Now != nil {
		return s.Now().UTC()
	}
	return time.Now().UTC()
}

func (s *Store) Create(ctx context.Context, meta session.Meta) (session.Meta, error) {
	meta, m, st, err := session.Creating(meta, s.now())
	if err != nil {
		return session.Meta{}, err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO sessions (tenant, id, created_at, updated_at, meta, state) VALUES (?, ?, ?, ?, ?, ?)`,
		meta.Tenant, string(meta.ID), meta.Created.UnixNano(), meta.Updated.UnixNano(), m, st)
	if err != nil {
		return session.Meta{}, fmt.Errorf("create session: %w", err)
	}
	return meta, nil
}

func (s *Store) meta(ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, tenant string, id session.ID) (session.Meta, string, error) {
	var created, updated int64
	var m, st string
	err := q.QueryRowContext(ctx, `SELECT created_at, updated_at, meta, state FROM sessions WHERE tenant = ? AND id = ?`,
		tenant, string(id)).Scan(&created, &updated, &m, &st)
	if errors.Is(err, sql.ErrNoRows) {
		return session.Meta{}, "", fmt.Errorf("%s: %w", id, session.ErrNotFound)
	}
	if err != nil {
		return session.Meta{}, "", fmt.Errorf("load session: %w", err)
	}
	meta, err := session.DecodeMeta(id, tenant, created, updated, m)
	return meta, st, err
}

func (s *Store) Load(ctx context.Context, tenant string, id session.ID) (session.Snapshot, error) {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return session.Snapshot{}, err
	}
	defer tx.Rollback()
	meta, st, err := s.meta(ctx, tx, tenant, id)
	if err != nil {
		return session.Snapshot{}, err
	}
	rows, err := tx.QueryContext(ctx, `SELECT seq, at, body FROM entries WHERE tenant = ? AND session_id = ? ORDER BY seq`, tenant, string(id))
	if err != nil {
		return session.Snapshot{}, fmt.Errorf("load log: %w", err)
	}
	defer rows.Close()
	return session.LoadSnapshot(meta, st, liveRows(ctx, tx, tenant, id), rows)
}

// liveRows reads a session's live context, a row per message, in order.
func liveRows(ctx context.Context, tx *sql.Tx, tenant string, id session.ID) func() ([][]byte, error) {
	return func() ([][]byte, error) {
		rows, err := tx.QueryContext(ctx, `SELECT body FROM live WHERE tenant = ? AND session_id = ? ORDER BY idx`, tenant, string(id))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		return session.LoadLive(rows)
	}
}

func (s *Store) LoadState(ctx context.Context, tenant string, id session.ID, known int64) (session.Current, error) {
	const head = `(SELECT COALESCE(MAX(seq), 0) FROM entries WHERE tenant = ? AND session_id = ?)`
	if known != 0 {
		// One statement, no state: the log still ending at known is
		// all a turn needs to know.
		var created, updated, seq int64
		var m string
		err := s.db.QueryRowContext(ctx, `SELECT created_at, updated_at, meta, `+head+` FROM sessions WHERE tenant = ? AND id = ?`,
			tenant, string(id), tenant, string(id)).Scan(&created, &updated, &m, &seq)
		if errors.Is(err, sql.ErrNoRows) {
			return session.Current{}, fmt.Errorf("%s: %w", id, session.ErrNotFound)
		}
		if err != nil {
			return session.Current{}, fmt.Errorf("load session: %w", err)
		}
		if seq == known {
			meta, err := session.DecodeMeta(id, tenant, created, updated, m)
			return session.Current{Meta: meta, Seq: seq}, err
		}
	}
	// The state and its live rows, of one moment.
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return session.Current{}, err
	}
	defer tx.Rollback()
	meta, st, err := s.meta(ctx, tx, tenant, id)
	if err != nil {
		return session.Current{}, err
	}
	var seq int64
	if err := tx.QueryRowContext(ctx, `SELECT `+head, tenant, string(id)).Scan(&seq); err != nil {
		return session.Current{}, fmt.Errorf("load session: %w", err)
	}
	return session.DecodeCurrent(meta, seq, 0, st, liveRows(ctx, tx, tenant, id))
}

func (s *Store) Append(ctx context.Context, tenant string, id session.ID, entries []session.Entry, st session.State) ([]session.Entry, error) {
	a, err := session.EncodeAppend(entries, st)
	if err != nil {
		return nil, err
	}
	tx, err := s.db.BeginTx(ctx, nil) // _txlock=immediate: the write lock is taken now
	if err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	defer tx.Rollback()
	_, stored, err := s.meta(ctx, tx, tenant, id)
	if err != nil {
		return nil, err
	}
	var last int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM entries WHERE tenant = ? AND session_id = ?`, tenant, string(id)).Scan(&last); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	now := s.now()
	out := session.Numbered(entries, last, now)
	for i := range out {
		if _, err := tx.ExecContext(ctx, `INSERT INTO entries (tenant, session_id, seq, at, kind, body) VALUES (?, ?, ?, ?, ?, ?)`,
			tenant, string(id), out[i].Seq, now.UnixNano(), a.Kinds[i], string(a.Bodies[i])); err != nil {
			return nil, fmt.Errorf("append: %w", err)
		}
	}
	// The live context: only the rows from the first that changed.
	from := a.RowsFrom(stored)
	if _, err := tx.ExecContext(ctx, `DELETE FROM live WHERE tenant = ? AND session_id = ? AND idx >= ?`, tenant, string(id), from); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	for i := from; i < len(a.Live); i++ {
		if _, err := tx.ExecContext(ctx, `INSERT INTO live (tenant, session_id, idx, body) VALUES (?, ?, ?, ?)`, tenant, string(id), i, string(a.Live[i])); err != nil {
			return nil, fmt.Errorf("append: %w", err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sessions SET state = ?, updated_at = ? WHERE tenant = ? AND id = ?`,
		string(a.State), now.UnixNano(), tenant, string(id)); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	return out, nil
}

func (s *Store) SetSettings(ctx context.Context, tenant string, id session.ID, st chat.Settings) (session.Meta, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return session.Meta{}, fmt.Errorf("set settings: %w", err)
	}
	defer tx.Rollback()
	meta, _, err := s.meta(ctx, tx, tenant, id)
	if err != nil {
		return session.Meta{}, err
	}
	meta.Settings, meta.Updated = st, s.now()
	m := session.EncodeMeta(meta)
	if _, err := tx.ExecContext(ctx, `UPDATE sessions SET meta = ?, updated_at = ? WHERE tenant = ? AND id = ?`,
		m, meta.Updated.UnixNano(), tenant, string(id)); err != nil {
		return session.Meta{}, fmt.Errorf("set settings: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return session.Meta{}, fmt.Errorf("set settings: %w", err)
	}
	return meta, nil
}

func (s *Store) List(ctx context.Context, tenant string) ([]session.Meta, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id FROM sessions WHERE tenant = ? ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	var ids []session.ID
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		ids = append(ids, session.ID(id))
	}
	rows.Close()
	var out []session.Meta
	for _, id := range ids {
		m, _, err := s.meta(ctx, s.db, tenant, id)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func (s *Store) Delete(ctx context.Context, tenant string, id session.ID) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sessions WHERE tenant = ? AND id = ?`, tenant, string(id))
	if err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%s: %w", id, session.ErrNotFound)
	}
	return nil
}

func (s *Store) LoadProxied(ctx context.Context, tenant, key string) (session.Proxied, error) {
	var st string
	err := s.proxied.QueryRowContext(ctx, `SELECT state FROM proxied WHERE tenant = ? AND key = ?`, tenant, key).Scan(&st)
	if errors.Is(err, sql.ErrNoRows) {
		return session.Proxied{}, fmt.Errorf("proxied %s: %w", key, session.ErrNotFound)
	}
	if err != nil {
		return session.Proxied{}, fmt.Errorf("load proxied: %w", err)
	}
	return session.DecodeProxied([]byte(st))
}

func (s *Store) SaveProxied(ctx context.Context, tenant, key string, p session.Proxied) error {
	b, err := session.EncodeProxied(p)
	if err != nil {
		return err
	}
	_, err = s.proxied.ExecContext(ctx, `INSERT INTO proxied (tenant, key, updated_at, state) VALUES (?, ?, ?, ?)
		ON CONFLICT (tenant, key) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state`,
		tenant, key, s.now().UnixNano(), string(b))
	if err != nil {
		return fmt.Errorf("save proxied: %w", err)
	}
	return nil
}

func (s *Store) ExpireProxied(ctx context.Context, idleBefore time.Time) (int, error) {
	res, err := s.proxied.ExecContext(ctx, `DELETE FROM proxied WHERE updated_at < ?`, idleBefore.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("expire proxied: %w", err)
	}
	n, _ := res.RowsAffected()
	if _, err := s.proxied.ExecContext(ctx, `DELETE FROM recalls WHERE removed_at < ? AND NOT EXISTS
		(SELECT 1 FROM proxied p WHERE p.tenant = recalls.tenant AND p.key = recalls.conversation)`, idleBefore.UnixNano()); err != nil {
		return int(n), fmt.Errorf("expire recalls: %w", err)
	}
	return int(n), nil
}

func (s *Store) ActiveProxied(ctx context.Context, since time.Time) (int, error) {
	var n int
	if err := s.proxied.QueryRowContext(ctx, `SELECT count(*) FROM proxied WHERE updated_at >= ?`, since.UnixNano()).Scan(&n); err != nil {
		return 0, fmt.Errorf("count proxied: %w", err)
	}
	return n, nil
}

func (s *Store) SaveRecalls(ctx context.Context, tenant string, rs []session.Recall) error {
	tx, err := s.proxied.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("save recalls: %w", err)
	}
	defer tx.Rollback()
	for _, r := range rs {
		b, err := session.EncodeRecall(r)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO recalls (tenant, handle, conversation, removed_at, recall) VALUES (?, ?, ?, ?, ?)
			ON CONFLICT (tenant, handle) DO NOTHING`, tenant, r.Handle, r.Conversation, r.Removed.UnixNano(), string(b)); err != nil {
			return fmt.Errorf("save recalls: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("save recalls: %w", err)
	}
	return nil
}

func (s *Store) LoadRecall(ctx context.Context, tenant, handle string) (session.Recall, error) {
	var b string
	err := s.proxied.QueryRowContext(ctx, `SELECT recall FROM recalls WHERE tenant = ? AND handle = ?`, tenant, handle).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return session.Recall{}, fmt.Errorf("recall %q: %w", handle, session.ErrNotFound)
	}
	if err != nil {
		return session.Recall{}, fmt.Errorf("load recall: %w", err)
	}
	return session.DecodeRecall([]byte(b))
}

func (s *Store) ListRecalls(ctx context.Context, tenant, conversation string) ([]session.Recall, error) {
	rows, err := s.proxied.QueryContext(ctx, `SELECT recall FROM recalls WHERE tenant = ? AND conversation = ?
		ORDER BY removed_at DESC, handle LIMIT ?`, tenant, conversation, session.MaxRecallList)
	if err != nil {
		return nil, fmt.Errorf("list recalls: %w", err)
	}
	defer rows.Close()
	return session.LoadRecalls(rows)
}

func (s *Store) AppendRequests(ctx context.Context, rs []session.Request) error {
	tx, err := s.proxied.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("append requests: %w", err)
	}
	defer tx.Rollback()
	// Lines go requestRows to a statement, prepared once for the batch
	// (and once more for the rest): parsing a statement per line cost more
	// than the insert, and executing one per line 1.2× as much.
	args := make([]any, 0, requestColumns*requestRows)
	var full *sql.Stmt
	for len(rs) > 0 {
		lines := rs[:min(len(rs), requestRows)]
		rs = rs[len(lines):]
		args = args[:0]
		for _, r := range lines {
			b, err := session.EncodeRequest(r)
			if err != nil {
				return err
			}
			sent, notSent, brk := r.Counted()
			args = append(args, r.Tenant, r.ID, r.UpstreamID, r.Conversation, r.Model, r.Time.UnixNano(),
				r.Input, r.CacheRead, r.CacheWrite, r.Output, r.Dollars, sent, notSent, brk, string(b))
		}
		ins := full
		if ins == nil || len(lines) < requestRows {
			if ins, err = tx.PrepareContext(ctx, insertRequests(len(lines))); err != nil {
				return fmt.Errorf("append requests: %w", err)
			}
			defer ins.Close()
			if len(lines) == requestRows {
				full = ins
			}
		}
		if _, err := ins.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("append requests: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("append requests: %w", err)
	}
	return nil
}

// requestRows is how many request log lines one insert writes.
const requestRows = 16

// requestColumns is how many values a request log line has.
const requestColumns = 15

// insertRequests is the statement that inserts n request log lines.
func insertRequests(n int) string {
	return `INSERT INTO requests (tenant, id, upstream_id, conversation, model, at, input, cache_read, cache_write, output, dollars, sent, not_sent, brk, line) VALUES ` +
		strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?), ", n), ", ")
}

func (s *Store) ListRequests(ctx context.Context, f session.RequestFilter) ([]session.Request, error) {
	where, args := f.Where(func(int) string { return "?" })
	rows, err := s.proxied.QueryContext(ctx, `SELECT line FROM requests WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("list requests: %w", err)
	}
	defer rows.Close()
	return session.LoadRequests(rows)
}

func (s *Store) SumRequests(ctx context.Context, tenant string, since time.Time) ([]session.Totals, error) {
	rows, err := s.proxied.QueryContext(ctx, session.SumSQL(func(int) string { return "?" }), tenant, since.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("sum requests: %w", err)
	}
	defer rows.Close()
	return session.LoadTotals(rows)
}

func (s *Store) TrimRequests(ctx context.Context, before time.Time, keep int) (int, error) {
	if _, err := s.proxied.ExecContext(ctx, `DELETE FROM requests WHERE at < ?`, before.UnixNano()); err != nil {
		return 0, fmt.Errorf("trim requests: %w", err)
	}
	if keep > 0 {
		if _, err := s.proxied.ExecContext(ctx, `DELETE FROM requests WHERE seq <= (SELECT seq FROM requests ORDER BY seq DESC LIMIT 1 OFFSET ?)`, keep); err != nil {
			return 0, fmt.Errorf("trim requests: %w", err)
		}
	}
	var n int
	if err := s.proxied.QueryRowContext(ctx, `SELECT count(*) FROM requests`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count requests: %w", err)
	}
	return n, nil
}

// Close closes the database.
func (s *Store) Close() error { return errors.Join(s.proxied.Close(), s.db.Close()) }

// Ping runs one constant-time query.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	return s.db.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
}

func (s *Store) LoadFile(ctx context.Context, k session.FileKey) (session.ProviderFile, error) {
	var b string
	err := s.proxied.QueryRowContext(ctx, `SELECT file FROM files WHERE upstream = ? AND credential = ? AND wire = ? AND ref = ?`,
		k.Upstream, k.Credential, k.Wire, k.Ref.String()).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return session.ProviderFile{}, fmt.Errorf("provider file: %w", session.ErrNotFound)
	}
	if err != nil {
		return session.ProviderFile{}, fmt.Errorf("load provider file: %w", err)
	}
	return session.DecodeFile([]byte(b))
}

func (s *Store) SaveFile(ctx context.Context, f session.ProviderFile) error {
	b, err := session.EncodeFile(f)
	if err != nil {
		return err
	}
	if _, err := s.proxied.ExecContext(ctx, `INSERT INTO files (upstream, credential, wire, ref, used, expires, file) VALUES (?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (upstream, credential, wire, ref) DO UPDATE SET used = excluded.used, expires = excluded.expires, file = excluded.file`,
		f.Upstream, f.Credential, f.Wire, f.Ref.String(), session.Unix(f.Used), session.Unix(f.Expires), string(b)); err != nil {
		return fmt.Errorf("save provider file: %w", err)
	}
	return nil
}

func (s *Store) DeleteFile(ctx context.Context, k session.FileKey) error {
	if _, err := s.proxied.ExecContext(ctx, `DELETE FROM files WHERE upstream = ? AND credential = ? AND wire = ? AND ref = ?`,
		k.Upstream, k.Credential, k.Wire, k.Ref.String()); err != nil {
		return fmt.Errorf("delete provider file: %w", err)
	}
	return nil
}

func (s *Store) StaleFiles(ctx context.Context, usedBefore time.Time) ([]session.ProviderFile, error) {
	t := usedBefore.UnixNano()
	rows, err := s.proxied.QueryContext(ctx, `SELECT file FROM files WHERE used < ? OR (expires > 0 AND expires < ?) ORDER BY used LIMIT ?`,
		t, t, session.MaxStaleFiles)
	if err != nil {
		return nil, fmt.Errorf("stale provider files: %w", err)
	}
	defer rows.Close()
	return session.LoadFiles(rows)
}
