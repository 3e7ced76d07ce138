-- Control plane: operator API keys, the hash-chained audit log, and the agent/workflow registry.

CREATE TABLE api_keys (
    id          UUID PRIMARY KEY,
    tenant_id   TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    name        TEXT NOT NULL,
    role        TEXT NOT NULL CHECK (role IN ('admin', 'operator', 'readonly')),
    -- SHA-256 of the whole key, hex. Keys carry 256 random bits, so a fast hash is enough.
    key_hash    TEXT NOT NULL UNIQUE,
    -- The first characters of the key, so an operator can tell keys apart in listings.
    key_prefix  TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at  TIMESTAMPTZ,
    revoked_at  TIMESTAMPTZ,
    last_used_at TIMESTAMPTZ
);

-- One row per tool call or admin change. Each row stores the hash of the previous row and the
-- hash of its own canonical content, so editing any row breaks the chain from there on.
CREATE TABLE audit_log (
    seq           BIGSERIAL PRIMARY KEY,
    id            UUID NOT NULL UNIQUE,
    tenant_id     TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    at            TIMESTAMPTZ NOT NULL,
    caller_kind   TEXT NOT NULL,
    caller_id     TEXT NOT NULL,
    kind          TEXT NOT NULL CHECK (kind IN ('tool', 'admin')),
    action        TEXT NOT NULL,
    decision      TEXT NOT NULL CHECK (decision IN ('allowed', 'denied')),
    reason_code   TEXT,
    reason        TEXT,
    args_digest   TEXT NOT NULL,
    outcome       TEXT NOT NULL,
    result_digest TEXT,
    duration_ms   BIGINT NOT NULL,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL
);
CREATE INDEX audit_log_action ON audit_log (tenant_id, action, seq);
CREATE INDEX audit_log_caller ON audit_log (tenant_id, caller_id, seq);
CREATE INDEX audit_log_at ON audit_log (tenant_id, at);

-- The registry of agents and workflows. A definition is a name of one kind; its versions are
-- manifests kept forever. Deleting a definition hides it from new work (deleted_at) but keeps the
-- rows, so executions that reference it stay readable.
CREATE TABLE definitions (
    id          UUID PRIMARY KEY,
    tenant_id   TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    kind        TEXT NOT NULL CHECK (kind IN ('agent', 'workflow')),
    name        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    deleted_at  TIMESTAMPTZ
);
CREATE UNIQUE INDEX definitions_live_name ON definitions (tenant_id, kind, name) WHERE deleted_at IS NULL;

CREATE TABLE definition_versions (
    id            UUID PRIMARY KEY,
    definition_id UUID NOT NULL REFERENCES definitions(id),
    tenant_id     TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    version       TEXT NOT NULL,
    v_major       BIGINT NOT NULL,
    v_minor       BIGINT NOT NULL,
    v_patch       BIGINT NOT NULL,
    v_pre         TEXT NOT NULL DEFAULT '',
    description   TEXT,
    labels        JSONB NOT NULL DEFAULT '{}',
    manifest      JSONB NOT NULL,
    manifest_yaml TEXT NOT NULL,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (definition_id, version)
);
