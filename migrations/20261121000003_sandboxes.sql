-- Sandboxes: the dispatcher's record of every container it creates.
--
-- A row is written BEFORE anything exists in Docker, so a crash at any point leaves either a row
-- with nothing behind it (cleaned up by the reaper's bookkeeping pass) or a row plus labelled
-- Docker objects (removed by the reaper). The row is the truth about ownership: Docker labels
-- cannot change after creation, so when a pool sandbox is handed out, or another instance adopts
-- a sandbox, only the row changes.

-- One row per database: a random identity stamped on every container and volume as the label
-- org.aegis.scope (together with the database name, so copies made from a template database
-- differ). Several orchestrators with different databases may share one Docker engine (parallel
-- tests, a developer's stack beside CI); a reaper only ever judges the objects of its own scope,
-- because it cannot know the instances recorded in another database.
CREATE TABLE sandbox_scope (
    singleton   BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (singleton),
    id          UUID NOT NULL DEFAULT gen_random_uuid(),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

INSERT INTO sandbox_scope DEFAULT VALUES;

CREATE TABLE sandboxes (
    id              UUID PRIMARY KEY,
    tenant_id       TEXT NOT NULL DEFAULT 'default' REFERENCES tenants (id),
    -- The orchestrator instance that holds the sandbox's stream; changes on adoption.
    instance_id     UUID NOT NULL REFERENCES node_instances (id),
    image           TEXT NOT NULL,
    -- Who the sandbox belongs to; 'pool' until the warm pool hands it out.
    owner_kind      TEXT NOT NULL
                    CHECK (owner_kind IN ('execution', 'session', 'operator', 'pool')),
    owner_id        TEXT NOT NULL,
    -- creating -> running -> destroying -> destroyed; creating|running -> failed.
    state           TEXT NOT NULL DEFAULT 'creating'
                    CHECK (state IN ('creating', 'running', 'destroying', 'destroyed', 'failed')),
    container_name  TEXT NOT NULL UNIQUE,
    container_id    TEXT,
    volume_name     TEXT NOT NULL UNIQUE,
    -- The effective (clamped) limits, network, roots and caller labels.
    spec            JSONB NOT NULL,
    -- Why the sandbox failed or was destroyed ("destroyed by owner", "reaped: ...").
    reason          TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    ready_at        TIMESTAMPTZ,
    destroyed_at    TIMESTAMPTZ
);

-- The reaper and adoption look up the sandboxes an instance still holds.
CREATE INDEX sandboxes_live_by_instance ON sandboxes (instance_id)
    WHERE state IN ('creating', 'running', 'destroying');

-- destroy_owned_by: an execution ends, a session is revoked.
CREATE INDEX sandboxes_live_by_owner ON sandboxes (tenant_id, owner_kind, owner_id)
    WHERE state IN ('creating', 'running');
