// Package postgres is the session store for several gateway replicas: the
// same tables and JSON as the SQLite store, on a PostgreSQL server reached
// with pgx, migrations embedded and applied on open.
//
// Replicas share it safely in two ways (docs/format.md "Concurrency"):
// Append takes the session's row lock, so sequence numbers never collide
// or reorder; and Lock, a session-level advisory lock, serialises whole
// turns across processes, so two replicas never run one session's upstream
// call from the same state.
package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/imgctx/imgctx/chat"
	"github.com/imgctx/imgctx/session"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Store is a session.Store on PostgreSQL.
type Store struct {
	pool *pgxpool.Pool
	// locks holds the connections that hold advisory locks, one per turn
	// in flight, apart from the queries' pool: turns waiting on locks can
	// never take every connection the turn holding one needs.
	locks *pgxpool.Pool
	// proxied writes the decisions of proxied conversations with
	// synchronous_commit off: visible to every replica at commit, durable
	// across a crash of imgctx, and a proxied request does not wait for
	// the server's WAL flush; a crash of PostgreSQL itself may lose the
	// last few, which costs a measurement, never a message (as the SQLite
	// store's synchronous=NORMAL writes).
	proxied *pgxpool.Pool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// migrated are the migrations this Open applied.
	migrated []int
}

var _ session.Shared = (*Store)(nil)

// migrateLock is the advisory lock key replicas starting at once take to
// apply migrations one at a time ("imgctx" in ASCII).
const migrateLock = 0x696d67637478

// Open connects to the database named by dsn (a PostgreSQL URL or key=value
// string) and applies any migration it has not seen. Its errors never carry
// the password (pgx redacts it from the connection string it quotes).
func Open(ctx context.Context, dsn string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("session database: bad DSN: %w", err)
	}
	if !strings.Contains(dsn, "pool_max_conns") {
		cfg.MaxConns = 16
	}
	lockCfg := cfg.Copy()
	lockCfg.MaxConns = max(cfg.MaxConns, 64)
	fastCfg := cfg.Copy()
	if fastCfg.ConnConfig.RuntimeParams == nil {
		fastCfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	fastCfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("session database: %w", err)
	}
	applied, err := migrate(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	locks, err := pgxpool.NewWithConfig(ctx, lockCfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("session database: %w", err)
	}
	fast, err := pgxpool.NewWithConfig(ctx, fastCfg)
	if err != nil {
		pool.Close()
		locks.Close()
		return nil, fmt.Errorf("session database: %w", err)
	}
	return &Store{pool: pool, locks: locks, proxied: fast, migrated: applied}, nil
}

// Migrated returns the versions of the migrations Open applied (none when
// the schema was current, or another replica applied them first).
func (s *Store) Migrated() []int { return s.migrated }

// migrate applies the migrations the database has not seen, one replica
// at a time, and returns their versions.
func migrate(ctx context.Context, pool *pgxpool.Pool) (applied []int, _ error) {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(files)
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback(ctx)
	// Replicas starting together apply migrations one at a time.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLock)); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY)`); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	for _, f := range files {
		v, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(f, "migrations/"), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("migration %s: bad name", f)
		}
		var seen bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM schema_migrations WHERE version = $1)`, v).Scan(&seen); err != nil {
			return nil, fmt.Errorf("migrate: %w", err)
		}
		if seen {
			continue
		}
		body, _ := migrations.ReadFile(f)
		if _, err := tx.Exec(ctx, string(body)); err != nil {
			return nil, fmt.Errorf("migration %s: %w", f, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, v); err != nil {
			return nil, fmt.Errorf("migration %s: %w", f, err)
		}
		applied = append(applied, v)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
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
	_, err = s.pool.Exec(ctx, `INSERT INTO sessions (tenant, id, created_at, updated_at, meta, state) VALUES ($1, $2, $3, $4, $5, $6)`,
		meta.Tenant, string(meta.ID), meta.Created.UnixNano(), meta.Updated.UnixNano(), m, st)
	if err != nil {
		return session.Meta{}, fmt.Errorf("create session: %w", err)
	}
	return meta, nil
}

// meta reads a session's row; forUpdate takes its row lock for the
// transaction.
func meta(ctx context.Context, q pgx.Tx, tenant string, id session.ID, forUpdate bool) (session.Meta, string, error) {
	var created, updated int64
	var m, st string
	sql := `SELECT created_at, updated_at, meta, state FROM sessions WHERE tenant = $1 AND id = $2`
	if forUpdate {
		sql += ` FOR UPDATE`
	}
	err := q.QueryRow(ctx, sql, tenant, string(id)).Scan(&created, &updated, &m, &st)
	if errors.Is(err, pgx.ErrNoRows) {
		return session.Meta{}, "", fmt.Errorf("%s: %w", id, session.ErrNotFound)
	}
	if err != nil {
		return session.Meta{}, "", fmt.Errorf("load session: %w", err)
	}
	meta, err := session.DecodeMeta(id, tenant, created, updated, m)
	return meta, st, err
}

func (s *Store) Load(ctx context.Context, tenant string, id session.ID) (session.Snapshot, error) {
	// Repeatable read: the state, its live rows and the log are of one moment.
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return session.Snapshot{}, fmt.Errorf("load session: %w", err)
	}
	defer tx.Rollback(ctx)
	m, st, err := meta(ctx, tx, tenant, id, false)
	if err != nil {
		return session.Snapshot{}, err
	}
	live := liveRows(ctx, tx, tenant, id)
	if _, err := live(); err != nil { // read before the log's rows are open on the connection
		return session.Snapshot{}, fmt.Errorf("load the live context: %w", err)
	}
	rows, err := tx.Query(ctx, `SELECT seq, at, body FROM entries WHERE tenant = $1 AND session_id = $2 ORDER BY seq`, tenant, string(id))
	if err != nil {
		return session.Snapshot{}, fmt.Errorf("load log: %w", err)
	}
	defer rows.Close()
	return session.LoadSnapshot(m, st, live, rows)
}

// liveRows reads a session's live context, a row per message, in order,
// once: later calls return what the first read.
func liveRows(ctx context.Context, tx pgx.Tx, tenant string, id session.ID) func() ([][]byte, error) {
	var out [][]byte
	var err error
	read := false
	return func() ([][]byte, error) {
		if read {
			return out, err
		}
		read = true
		var rows pgx.Rows
		if rows, err = tx.Query(ctx, `SELECT body FROM live WHERE tenant = $1 AND session_id = $2 ORDER BY idx`, tenant, string(id)); err != nil {
			return nil, err
		}
		defer rows.Close()
		out, err = session.LoadLive(rows)
		return out, err
	}
}

func (s *Store) LoadState(ctx context.Context, tenant string, id session.ID, known int64) (session.Current, error) {
	const head = `(SELECT COALESCE(MAX(seq), 0) FROM entries WHERE tenant = $1 AND session_id = $2)`
	if known != 0 {
		// One statement, no state: the log still ending at known is
		// all a turn needs to know.
		var created, updated, seq int64
		var m string
		err := s.pool.QueryRow(ctx, `SELECT created_at, updated_at, meta, `+head+` FROM sessions WHERE tenant = $1 AND id = $2`,
			tenant, string(id)).Scan(&created, &updated, &m, &seq)
		if errors.Is(err, pgx.ErrNoRows) {
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
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return session.Current{}, fmt.Errorf("load session: %w", err)
	}
	defer tx.Rollback(ctx)
	m, st, err := meta(ctx, tx, tenant, id, false)
	if err != nil {
		return session.Current{}, err
	}
	var seq int64
	if err := tx.QueryRow(ctx, `SELECT `+head, tenant, string(id)).Scan(&seq); err != nil {
		return session.Current{}, fmt.Errorf("load session: %w", err)
	}
	return session.DecodeCurrent(m, seq, 0, st, liveRows(ctx, tx, tenant, id))
}

func (s *Store) Append(ctx context.Context, tenant string, id session.ID, entries []session.Entry, st session.State) ([]session.Entry, error) {
	a, err := session.EncodeAppend(entries, st)
	if err != nil {
		return nil, err
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	defer tx.Rollback(ctx)
	// The row lock orders appends to one session from any replica.
	_, stored, err := meta(ctx, tx, tenant, id, true)
	if err != nil {
		return nil, err
	}
	var last int64
	if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(seq), 0) FROM entries WHERE tenant = $1 AND session_id = $2`, tenant, string(id)).Scan(&last); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	now := s.now()
	out := session.Numbered(entries, last, now)
	batch := &pgx.Batch{}
	for i := range out {
		batch.Queue(`INSERT INTO entries (tenant, session_id, seq, at, kind, body) VALUES ($1, $2, $3, $4, $5, $6)`,
			tenant, string(id), out[i].Seq, now.UnixNano(), a.Kinds[i], string(a.Bodies[i]))
	}
	// The live context: only the rows from the first that changed.
	from := a.RowsFrom(stored)
	batch.Queue(`DELETE FROM live WHERE tenant = $1 AND session_id = $2 AND idx >= $3`, tenant, string(id), from)
	for i := from; i < len(a.Live); i++ {
		batch.Queue(`INSERT INTO live (tenant, session_id, idx, body) VALUES ($1, $2, $3, $4)`, tenant, string(id), i, string(a.Live[i]))
	}
	batch.Queue(`UPDATE sessions SET state = $1, updated_at = $2 WHERE tenant = $3 AND id = $4`,
		string(a.State), now.UnixNano(), tenant, string(id))
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("append: %w", err)
	}
	return out, nil
}

func (s *Store) SetSettings(ctx context.Context, tenant string, id session.ID, st chat.Settings) (session.Meta, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return session.Meta{}, fmt.Errorf("set settings: %w", err)
	}
	defer tx.Rollback(ctx)
	m, _, err := meta(ctx, tx, tenant, id, true)
	if err != nil {
		return session.Meta{}, err
	}
	m.Settings, m.Updated = st, s.now()
	if _, err := tx.Exec(ctx, `UPDATE sessions SET meta = $1, updated_at = $2 WHERE tenant = $3 AND id = $4`,
		session.EncodeMeta(m), m.Updated.UnixNano(), tenant, string(id)); err != nil {
		return session.Meta{}, fmt.Errorf("set settings: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return session.Meta{}, fmt.Errorf("set settings: %w", err)
	}
	return m, nil
}

func (s *Store) List(ctx context.Context, tenant string) ([]session.Meta, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, created_at, updated_at, meta FROM sessions WHERE tenant = $1 ORDER BY created_at, id`, tenant)
	if err != nil {
		return nil, fmt.Errorf("list sessions: %w", err)
	}
	defer rows.Close()
	var out []session.Meta
	for rows.Next() {
		var id, m string
		var created, updated int64
		if err := rows.Scan(&id, &created, &updated, &m); err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		meta, err := session.DecodeMeta(session.ID(id), tenant, created, updated, m)
		if err != nil {
			return nil, fmt.Errorf("list sessions: %w", err)
		}
		out = append(out, meta)
	}
	return out, rows.Err()
}

func (s *Store) Delete(ctx context.Context, tenant string, id session.ID) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM sessions WHERE tenant = $1 AND id = $2`, tenant, string(id))
	if err != nil {
		return fmt.Errorf("delete session: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("%s: %w", id, session.ErrNotFound)
	}
	return nil
}

// Lock takes a session-level advisory lock on one pooled connection and
// holds it until unlock: a replica that dies lets go with its connection.
// The key is a 64-bit hash of tenant and id; a collision only makes two
// sessions wait for each other.
func (s *Store) Lock(ctx context.Context, tenant string, id session.ID) (func(), error) {
	conn, err := s.locks.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock session: %w", err)
	}
	key := tenant + "/" + string(id)
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, key); err != nil {
		conn.Release()
		return nil, fmt.Errorf("lock session: %w", err)
	}
	return func() {
		// A fresh context: the caller's may be done, the lock must go.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, key); err != nil {
			// Closing the connection ends its session, and the lock with it.
			conn.Conn().Close(ctx)
		}
		conn.Release()
	}, nil
}

func (s *Store) LoadProxied(ctx context.Context, tenant, key string) (session.Proxied, error) {
	var st string
	err := s.pool.QueryRow(ctx, `SELECT state FROM proxied WHERE tenant = $1 AND key = $2`, tenant, key).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
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
	_, err = s.proxied.Exec(ctx, `INSERT INTO proxied (tenant, key, updated_at, state) VALUES ($1, $2, $3, $4)
		ON CONFLICT (tenant, key) DO UPDATE SET updated_at = excluded.updated_at, state = excluded.state`,
		tenant, key, s.now().UnixNano(), string(b))
	if err != nil {
		return fmt.Errorf("save proxied: %w", err)
	}
	return nil
}

func (s *Store) ExpireProxied(ctx context.Context, idleBefore time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx, `DELETE FROM proxied WHERE updated_at < $1`, idleBefore.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("expire proxied: %w", err)
	}
	if _, err := s.pool.Exec(ctx, `DELETE FROM recalls WHERE removed_at < $1 AND NOT EXISTS
		(SELECT 1 FROM proxied p WHERE p.tenant = recalls.tenant AND p.key = recalls.conversation)`, idleBefore.UnixNano()); err != nil {
		return int(tag.RowsAffected()), fmt.Errorf("expire recalls: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

func (s *Store) ActiveProxied(ctx context.Context, since time.Time) (int, error) {
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM proxied WHERE updated_at >= $1`, since.UnixNano()).Scan(&n); err != nil {
		return 0, fmt.Errorf("count proxied: %w", err)
	}
	return n, nil
}

func (s *Store) SaveRecalls(ctx context.Context, tenant string, rs []session.Recall) error {
	var batch pgx.Batch
	for _, r := range rs {
		b, err := session.EncodeRecall(r)
		if err != nil {
			return err
		}
		batch.Queue(`INSERT INTO recalls (tenant, handle, conversation, removed_at, recall) VALUES ($1, $2, $3, $4, $5)
			ON CONFLICT (tenant, handle) DO NOTHING`, tenant, r.Handle, r.Conversation, r.Removed.UnixNano(), string(b))
	}
	if err := s.pool.SendBatch(ctx, &batch).Close(); err != nil {
		return fmt.Errorf("save recalls: %w", err)
	}
	return nil
}

func (s *Store) LoadRecall(ctx context.Context, tenant, handle string) (session.Recall, error) {
	var b string
	err := s.pool.QueryRow(ctx, `SELECT recall FROM recalls WHERE tenant = $1 AND handle = $2`, tenant, handle).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
		return session.Recall{}, fmt.Errorf("recall %q: %w", handle, session.ErrNotFound)
	}
	if err != nil {
		return session.Recall{}, fmt.Errorf("load recall: %w", err)
	}
	return session.DecodeRecall([]byte(b))
}

func (s *Store) ListRecalls(ctx context.Context, tenant, conversation string) ([]session.Recall, error) {
	rows, err := s.pool.Query(ctx, `SELECT recall FROM recalls WHERE tenant = $1 AND conversation = $2
		ORDER BY removed_at DESC, handle LIMIT $3`, tenant, conversation, session.MaxRecallList)
	if err != nil {
		return nil, fmt.Errorf("list recalls: %w", err)
	}
	defer rows.Close()
	return session.LoadRecalls(rows)
}

func (s *Store) AppendRequests(ctx context.Context, rs []session.Request) error {
	var batch pgx.Batch
	for _, r := range rs {
		b, err := session.EncodeRequest(r)
		if err != nil {
			return err
		}
		sent, notSent, brk := r.Counted()
		batch.Queue(`INSERT INTO requests (tenant, id, upstream_id, conversation, model, at, input, cache_read, cache_write, output, dollars, sent, not_sent, brk, line)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)`,
			r.Tenant, r.ID, r.UpstreamID, r.Conversation, r.Model, r.Time.UnixNano(), r.Input, r.CacheRead, r.CacheWrite, r.Output, r.Dollars, sent, notSent, brk, string(b))
	}
	if err := s.pool.SendBatch(ctx, &batch).Close(); err != nil {
		return fmt.Errorf("append requests: %w", err)
	}
	return nil
}

func (s *Store) ListRequests(ctx context.Context, f session.RequestFilter) ([]session.Request, error) {
	where, args := f.Where(func(n int) string { return "$" + strconv.Itoa(n) })
	rows, err := s.pool.Query(ctx, `SELECT line FROM requests WHERE `+where, args...)
	if err != nil {
		return nil, fmt.Errorf("list requests: %w", err)
	}
	defer rows.Close()
	return session.LoadRequests(rows)
}

func (s *Store) SumRequests(ctx context.Context, tenant string, since time.Time) ([]session.Totals, error) {
	rows, err := s.pool.Query(ctx, session.SumSQL(func(n int) string { return "$" + strconv.Itoa(n) }), tenant, since.UnixNano())
	if err != nil {
		return nil, fmt.Errorf("sum requests: %w", err)
	}
	defer rows.Close()
	return session.LoadTotals(rows)
}

func (s *Store) TrimRequests(ctx context.Context, before time.Time, keep int) (int, error) {
	if _, err := s.pool.Exec(ctx, `DELETE FROM requests WHERE at < $1`, before.UnixNano()); err != nil {
		return 0, fmt.Errorf("trim requests: %w", err)
	}
	if keep > 0 {
		if _, err := s.pool.Exec(ctx, `DELETE FROM requests WHERE seq <= (SELECT seq FROM requests ORDER BY seq DESC LIMIT 1 OFFSET $1)`, keep); err != nil {
			return 0, fmt.Errorf("trim requests: %w", err)
		}
	}
	var n int
	if err := s.pool.QueryRow(ctx, `SELECT count(*) FROM requests`).Scan(&n); err != nil {
		return 0, fmt.Errorf("count requests: %w", err)
	}
	return n, nil
}

// Ping runs one constant-time query.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	return s.pool.QueryRow(ctx, `SELECT 1`).Scan(&one)
}

// Close closes the pool.
func (s *Store) Close() error {
	s.proxied.Close()
	s.locks.Close()
	s.pool.Close()
	return nil
}

func (s *Store) LoadFile(ctx context.Context, k session.FileKey) (session.ProviderFile, error) {
	var b string
	err := s.pool.QueryRow(ctx, `SELECT file FROM files WHERE upstream = $1 AND credential = $2 AND wire = $3 AND ref = $4`,
		k.Upstream, k.Credential, k.Wire, k.Ref.String()).Scan(&b)
	if errors.Is(err, pgx.ErrNoRows) {
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
	if _, err := s.pool.Exec(ctx, `INSERT INTO files (upstream, credential, wire, ref, used, expires, file) VALUES ($1, $2, $3, $4, $5, $6, $7)
		ON CONFLICT (upstream, credential, wire, ref) DO UPDATE SET used = excluded.used, expires = excluded.expires, file = excluded.file`,
		f.Upstream, f.Credential, f.Wire, f.Ref.String(), session.Unix(f.Used), session.Unix(f.Expires), string(b)); err != nil {
		return fmt.Errorf("save provider file: %w", err)
	}
	return nil
}

func (s *Store) DeleteFile(ctx context.Context, k session.FileKey) error {
	if _, err := s.pool.Exec(ctx, `DELETE FROM files WHERE upstream = $1 AND credential = $2 AND wire = $3 AND ref = $4`,
		k.Upstream, k.Credential, k.Wire, k.Ref.String()); err != nil {
		return fmt.Errorf("delete provider file: %w", err)
	}
	return nil
}

func (s *Store) StaleFiles(ctx context.Context, usedBefore time.Time) ([]session.ProviderFile, error) {
	t := usedBefore.UnixNano()
	rows, err := s.pool.Query(ctx, `SELECT file FROM files WHERE used < $1 OR (expires > 0 AND expires < $1) ORDER BY used LIMIT $2`,
		t, session.MaxStaleFiles)
	if err != nil {
		return nil, fmt.Errorf("stale provider files: %w", err)
	}
	defer rows.Close()
	return session.LoadFiles(rows)
}
