-- imgctx sessions on PostgreSQL, schema version 1 (docs/format.md): the
-- same tables as the SQLite store, the same JSON in the text columns.
CREATE TABLE sessions (
    tenant     TEXT   NOT NULL,
    id         TEXT   NOT NULL,
    created_at BIGINT NOT NULL, -- unix nanoseconds, UTC
    updated_at BIGINT NOT NULL,
    meta       TEXT   NOT NULL, -- JSON: thread, settings
    state      TEXT   NOT NULL, -- JSON: session.State, versioned
    PRIMARY KEY (tenant, id)
);

CREATE TABLE entries (
    tenant     TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    seq        BIGINT NOT NULL, -- 1, 2, 3 … per session; append only
    at         BIGINT NOT NULL,
    kind       TEXT   NOT NULL CHECK (kind IN ('message', 'compaction')),
    body       TEXT   NOT NULL, -- JSON: {"message": …} or {"compaction": …}
    PRIMARY KEY (tenant, session_id, seq),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
