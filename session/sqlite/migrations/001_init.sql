-- imgctx sessions, schema version 1 (docs/format.md).
CREATE TABLE sessions (
    tenant     TEXT    NOT NULL,
    id         TEXT    NOT NULL,
    created_at INTEGER NOT NULL, -- unix nanoseconds, UTC
    updated_at INTEGER NOT NULL,
    meta       TEXT    NOT NULL, -- JSON: thread, settings
    state      TEXT    NOT NULL, -- JSON: session.State, versioned
    PRIMARY KEY (tenant, id)
);

CREATE TABLE entries (
    tenant     TEXT    NOT NULL,
    session_id TEXT    NOT NULL,
    seq        INTEGER NOT NULL, -- 1, 2, 3 … per session; append only
    at         INTEGER NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('message', 'compaction')),
    body       TEXT    NOT NULL, -- JSON: {"message": …} or {"compaction": …}
    PRIMARY KEY (tenant, session_id, seq),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
