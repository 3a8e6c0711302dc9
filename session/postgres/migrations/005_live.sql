-- imgctx sessions on PostgreSQL, schema version 5: a session's live context
-- a row per message (docs/format.md "Sessions"), so a turn writes only the
-- messages it changed or added; the state then names how many rows there are.
CREATE TABLE live (
    tenant     TEXT   NOT NULL,
    session_id TEXT   NOT NULL,
    idx        BIGINT NOT NULL, -- 0, 1, 2 … : the message's place in the live context
    body       TEXT   NOT NULL, -- JSON: a chat message
    PRIMARY KEY (tenant, session_id, idx),
    FOREIGN KEY (tenant, session_id) REFERENCES sessions (tenant, id) ON DELETE CASCADE
);
