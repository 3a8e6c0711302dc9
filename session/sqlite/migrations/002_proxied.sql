-- imgctx sessions, schema version 2: the decisions of proxied conversations
-- (docs/format.md "Proxied conversations"). Keyed by a hash of the
-- conversation's identity; only decisions, never messages.
CREATE TABLE proxied (
    tenant     TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    updated_at INTEGER NOT NULL, -- unix nanoseconds, UTC
    state      TEXT    NOT NULL, -- JSON: session.Proxied, versioned
    PRIMARY KEY (tenant, key)
);
CREATE INDEX proxied_updated ON proxied (updated_at);
