-- Persistent agent volumes (spec.volumes with storage_class: persistent): one row per
-- (tenant, agent, owner, name). The owner is the principal at the root of the execution tree
-- (an API key or a SEAL session), so two callers of one agent never see each other's files.
-- The content is the volume's tar archive, copied into the sandbox's workspace when an
-- execution starts and back when it ends; a row past expires_at is deleted by the sweep.
CREATE TABLE agent_volumes (
    id                 UUID PRIMARY KEY,
    tenant_id          TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    agent_id           UUID NOT NULL,
    owner              TEXT NOT NULL,
    name               TEXT NOT NULL,
    size_limit_bytes   BIGINT NOT NULL CHECK (size_limit_bytes > 0),
    content            BYTEA NOT NULL DEFAULT '',
    content_bytes      BIGINT NOT NULL DEFAULT 0,
    last_execution_id  UUID,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at         TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant_id, agent_id, owner, name)
);
CREATE INDEX agent_volumes_expiry ON agent_volumes (expires_at);
