-- Sessions of the operator console (`/console`, orchestrator/src/api/console/session.rs).
-- The browser holds a random token in an HttpOnly cookie; only its SHA-256 is stored here. The
-- API key the session acts as is kept sealed by that token (XOR with an HMAC-SHA256 pad keyed by
-- it), so neither this table alone nor the cookie alone gives the key back. Every page is a call
-- to the node's own REST routes as that key, which REST authenticates again each time: a revoked
-- or expired key ends the session on the next request.
CREATE TABLE console_sessions (
    id          UUID PRIMARY KEY,
    tenant_id   TEXT NOT NULL DEFAULT 'default',
    token_hash  TEXT NOT NULL UNIQUE,
    api_key_id  UUID NOT NULL REFERENCES api_keys(id) ON DELETE CASCADE,
    key_sealed  BYTEA NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ NOT NULL,
    revoked_at  TIMESTAMPTZ
);
CREATE INDEX console_sessions_key ON console_sessions (api_key_id) WHERE revoked_at IS NULL;
