-- imgctx sessions, schema version 6: the images imgctx uploaded to a
-- provider's Files API (upstreams[].file_ids), one row per image, upstream,
-- credential fingerprint and wire; never the credential itself.
CREATE TABLE files (
    upstream   TEXT    NOT NULL,
    credential TEXT    NOT NULL, -- a fingerprint
    wire       TEXT    NOT NULL,
    ref        TEXT    NOT NULL,
    used       INTEGER NOT NULL, -- unix nanoseconds, UTC
    expires    INTEGER NOT NULL, -- 0: never by itself
    file       TEXT    NOT NULL, -- JSON: session.ProviderFile
    PRIMARY KEY (upstream, credential, wire, ref)
);
CREATE INDEX files_used ON files (used);
