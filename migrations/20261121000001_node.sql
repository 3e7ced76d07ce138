-- The orchestrator node's own bookkeeping: which instances have run against this database.
-- Later features (agents, executions, sandboxes, audit) add their own tables; every table that
-- holds tenant data carries tenant_id.

CREATE TABLE tenants (
    id          TEXT PRIMARY KEY,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

INSERT INTO tenants (id) VALUES ('default');

CREATE TABLE node_instances (
    id            UUID PRIMARY KEY,
    hostname      TEXT NOT NULL,
    version       TEXT NOT NULL,
    started_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    heartbeat_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    stopped_at    TIMESTAMPTZ
);
