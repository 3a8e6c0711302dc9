-- imgctx sessions on PostgreSQL, schema version 4: the request log (docs/format.md
-- "Request log"), one line per request, trimmed by age and by rows.
CREATE TABLE requests (
    seq          BIGSERIAL PRIMARY KEY,
    tenant       TEXT    NOT NULL,
    id           TEXT    NOT NULL,
    upstream_id  TEXT    NOT NULL,
    conversation TEXT    NOT NULL,
    model        TEXT    NOT NULL,
    at           BIGINT  NOT NULL, -- unix nanoseconds, UTC
    -- the numbers the dashboard sums over the whole log
    input        BIGINT NOT NULL,
    cache_read   BIGINT NOT NULL,
    cache_write  BIGINT NOT NULL,
    output       BIGINT NOT NULL,
    dollars      DOUBLE PRECISION NOT NULL,
    sent         BIGINT NOT NULL, -- images sent
    not_sent     BIGINT NOT NULL,
    brk          BIGINT NOT NULL, -- 1: a prefix break
    line         TEXT    NOT NULL  -- JSON: session.Request
);
CREATE INDEX requests_at ON requests (at);
CREATE INDEX requests_tenant ON requests (tenant, seq);
CREATE INDEX requests_conversation ON requests (tenant, conversation, seq);
CREATE INDEX requests_id ON requests (tenant, id);
