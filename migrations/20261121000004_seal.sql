-- SEAL: security contexts, attested sessions, the token signing key, and the replay guard.

-- Security contexts: what a SEAL session may call. Loaded from the node config at start
-- (source 'config') or managed through /v1/security-contexts (source 'api').
CREATE TABLE security_contexts (
    tenant_id   TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    name        TEXT NOT NULL,
    definition  JSONB NOT NULL,
    source      TEXT NOT NULL CHECK (source IN ('config', 'api')),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, name)
);

-- One row per successful attestation. The public key is the client's ephemeral Ed25519 key;
-- every envelope of the session must verify against it.
CREATE TABLE seal_sessions (
    id            UUID PRIMARY KEY,
    tenant_id     TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    context_name  TEXT NOT NULL,
    workload_id   TEXT NOT NULL,
    public_key    BYTEA NOT NULL CHECK (length(public_key) = 32),
    token_id      TEXT NOT NULL UNIQUE,
    status        TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL,
    revoked_at    TIMESTAMPTZ,
    sandbox_id    UUID
);
CREATE INDEX seal_sessions_live ON seal_sessions (tenant_id, status, expires_at);

-- The node's token signing key (Ed25519 seed), made at first start so tokens survive restarts
-- and every replica signs and verifies with the same key.
CREATE TABLE seal_signing_keys (
    kid         TEXT PRIMARY KEY,
    seed        BYTEA NOT NULL CHECK (length(seed) = 32),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Envelope signatures seen within the freshness window: a second use is a replay.
CREATE TABLE seal_replay_guard (
    signature   TEXT PRIMARY KEY,
    session_id  UUID NOT NULL,
    seen_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX seal_replay_guard_seen ON seal_replay_guard (seen_at);

-- Attestation attempts, for the per-workload rate limit.
CREATE TABLE seal_attest_attempts (
    workload_id TEXT NOT NULL,
    at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX seal_attest_attempts_w ON seal_attest_attempts (workload_id, at);
