-- imgctx sessions, schema version 4: the request log (docs/format.md
-- "Request log"), one line per request, trimmed by age and by rows.
CREATE TABLE requests (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant       TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    upstream_id  TEXT    NOT NULL,
    conversation TEXT    NOT NULL,
    model        TEXT    NOT NULL,
    at           INTEGER NOT NULL, -- unix nanoseconds, UTC
    -- the numbers the dashboard sums over the whole log
    input        INTEGER NOT NULL,
    cache_read   INTEGER NOT NULL,
    cache_write  INTEGER NOT NULL,
    output       INTEGER NOT NULL,
    dollars      REAL NOT NULL,
    sent         INTEGER NOT NULL, -- images sent
    not_sent     INTEGER NOT NULL,
    brk          INTEGER NOT NULL, -- 1: a prefix break
    line         TEXT    NOT NULL  -- JSON: session.Request
);
CREATE INDEX requests_at ON requests (at);
CREATE INDEX requests_tenant ON requests (tenant, seq);
CREATE INDEX requests_conversation ON requests (tenant, conversation, seq);
CREATE INDEX requests_id ON requests (tenant, id);
