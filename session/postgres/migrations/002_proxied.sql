-- imgctx sessions on PostgreSQL, schema version 2: the decisions of proxied
-- conversations (docs/format.md "Proxied conversations").
CREATE TABLE proxied (
    tenant     TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    updated_at BIGINT NOT NULL, -- unix nanoseconds, UTC
    state      TEXT   NOT NULL, -- JSON: session.Proxied, versioned
    PRIMARY KEY (tenant, key)
);
CREATE INDEX proxied_updated ON proxied (updated_at);
