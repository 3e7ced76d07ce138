-- Attestation proof, attestation rate limits per source and node-wide, and human approval of
-- privileged tool calls.

-- One-time attestation tokens: issued by an operator for one security context (optionally for
-- one workload), shown once, stored only as a SHA-256, usable once before they expire.
CREATE TABLE seal_attestation_tokens (
    id            UUID PRIMARY KEY,
    tenant_id     TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    context_name  TEXT NOT NULL,
    -- When set, only this workload may use the token.
    workload_id   TEXT,
    token_hash    TEXT NOT NULL UNIQUE,
    -- First characters of the token, so operators can tell tokens apart in listings.
    token_prefix  TEXT NOT NULL,
    -- The API key that issued it.
    issued_by     TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at    TIMESTAMPTZ NOT NULL,
    used_at       TIMESTAMPTZ,
    used_by       TEXT,
    -- The session the token opened.
    session_id    UUID
);
CREATE INDEX seal_attestation_tokens_context ON seal_attestation_tokens (tenant_id, context_name, created_at);

-- Attestation attempts also remember where they came from, for the per-source limit; the
-- node-wide limit counts every attempt of the last minute.
ALTER TABLE seal_attest_attempts ADD COLUMN source TEXT;
CREATE INDEX seal_attest_attempts_source ON seal_attest_attempts (source, at);
CREATE INDEX seal_attest_attempts_at ON seal_attest_attempts (at);

-- Human approval of privileged calls: a call whose capability sets require_approval waits for
-- an operator's decision. The arguments are kept only while the request is pending (the
-- operator must see what they approve) and erased once it is decided or timed out.
CREATE TABLE tool_approvals (
    id              UUID PRIMARY KEY,
    tenant_id       TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    tool            TEXT NOT NULL,
    arguments       JSONB,
    args_digest     TEXT NOT NULL,
    caller_kind     TEXT NOT NULL,
    caller_id       TEXT NOT NULL,
    caller_label    TEXT NOT NULL,
    security_context TEXT,
    status          TEXT NOT NULL DEFAULT 'pending'
                    CHECK (status IN ('pending', 'approved', 'rejected', 'timed_out')),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at      TIMESTAMPTZ NOT NULL,
    decided_at      TIMESTAMPTZ,
    decided_by      TEXT,
    decision_note   TEXT
);
CREATE INDEX tool_approvals_status ON tool_approvals (tenant_id, status, created_at);
