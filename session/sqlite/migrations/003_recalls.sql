-- imgctx sessions, schema version 3: the recall handles of removed images
-- (docs/format.md "Recall handles"). A handle resolves within its tenant;
-- its rows go with their proxied conversation when it expires.
CREATE TABLE recalls (
    tenant       TEXT    NOT NULL,
    handle       TEXT    NOT NULL,
    conversation TEXT    NOT NULL,
    removed_at   INTEGER NOT NULL, -- unix nanoseconds, UTC
    recall       TEXT    NOT NULL, -- JSON: session.Recall
    PRIMARY KEY (tenant, handle)
);
CREATE INDEX recalls_conversation ON recalls (tenant, conversation, removed_at);
