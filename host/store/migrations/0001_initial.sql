-- toolhost's store, version 1: the same records as the redb store's tables.
-- JSON records are TEXT: the host reads them as it writes them, and psql shows them.

CREATE TABLE tools (
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    entry TEXT NOT NULL,
    PRIMARY KEY (tenant, name)
);

-- A blob is written before the entry that refers to it, maybe by another node: only blobs
-- older than any install takes are collected (`created_at_ms`).
CREATE TABLE blobs (
    sha TEXT PRIMARY KEY,
    bytes BYTEA NOT NULL,
    created_at_ms BIGINT NOT NULL
);

-- Bytes of each tenant's KV and cache entries: the row is locked by every write that
-- charges it, so the quota holds across nodes.
CREATE TABLE usage (
    tenant TEXT PRIMARY KEY,
    bytes BIGINT NOT NULL
);

CREATE TABLE cache (
    tenant TEXT NOT NULL,
    key BYTEA NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
);
CREATE INDEX cache_expiry ON cache (expires_at_ms);

CREATE TABLE kv (
    tenant TEXT NOT NULL,
    tool TEXT NOT NULL,
    key BYTEA NOT NULL,
    value BYTEA NOT NULL,
    PRIMARY KEY (tenant, tool, key)
);

CREATE TABLE config (
    tenant TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (tenant, key)
);

CREATE TABLE policies (
    tenant TEXT PRIMARY KEY,
    policy TEXT NOT NULL
);

CREATE TABLE tenants (
    tenant TEXT PRIMARY KEY,
    created_at_ms BIGINT NOT NULL
);

-- By the sha256 of the key: the key itself is never stored.
CREATE TABLE keys (
    hash TEXT PRIMARY KEY,
    id TEXT NOT NULL,
    record TEXT NOT NULL
);
CREATE INDEX keys_by_id ON keys (id);

CREATE TABLE held_calls (
    id TEXT PRIMARY KEY,
    held TEXT NOT NULL
);

CREATE TABLE search_vectors (
    key TEXT PRIMARY KEY,
    vector BYTEA NOT NULL
);

-- Calls submitted to run on whichever node claims them (`FOR UPDATE SKIP LOCKED`), leased
-- to that node while it runs them. `call` is the whole record as JSON; the columns are what
-- claims and renewals select on.
CREATE TABLE durable_calls (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    status TEXT NOT NULL,
    node TEXT,
    lease_until_ms BIGINT,
    created_at_ms BIGINT NOT NULL,
    ended_at_ms BIGINT,
    call TEXT NOT NULL
);
CREATE INDEX durable_calls_unended ON durable_calls (created_at_ms)
    WHERE status IN ('queued', 'running');
CREATE INDEX durable_calls_ended ON durable_calls (ended_at_ms) WHERE ended_at_ms IS NOT NULL;
CREATE INDEX durable_calls_by_tenant ON durable_calls (tenant, status);

-- Each node's last heartbeat: nodes seen lately share the tenants' rate and concurrency limits.
CREATE TABLE nodes (
    node TEXT PRIMARY KEY,
    last_seen_ms BIGINT NOT NULL
);

-- MCP sessions, so that a client's next request may reach any node: the node that does not
-- hold the session restores it from its `initialize` parameters (rmcp's session store).
CREATE TABLE mcp_sessions (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL,
    touched_at_ms BIGINT NOT NULL
);
CREATE INDEX mcp_sessions_by_age ON mcp_sessions (touched_at_ms);
