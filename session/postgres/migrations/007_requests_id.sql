-- imgctx sessions, schema version 7: the request log drops its index on
-- (tenant, id). A line is looked up by its id or its upstream's id
-- (id = ? OR upstream_id = ?), which no single index serves, so the
-- lookup always went through requests_tenant; the index only cost every
-- insert a fifth of its time.
DROP INDEX IF EXISTS requests_id;
