-- Agent executions and their append-only, sequence-numbered event log.

CREATE TABLE executions (
    id                  UUID PRIMARY KEY,
    tenant_id           TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    agent_id            UUID NOT NULL,
    agent_version_id    UUID NOT NULL,
    agent_name          TEXT NOT NULL,
    agent_version       TEXT NOT NULL,
    parent_execution_id UUID,
    status              TEXT NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'running', 'completed', 'failed', 'cancelled', 'timed_out')),
    input               JSONB NOT NULL DEFAULT '{}',
    intent              TEXT,
    caller_kind         TEXT NOT NULL,
    caller_id           TEXT NOT NULL,
    -- The orchestrator instance running it: after a crash, the next start fails what was running.
    instance_id         UUID NOT NULL REFERENCES node_instances(id),
    iteration_count     INT NOT NULL DEFAULT 0,
    last_output         TEXT,
    last_error          TEXT,
    sandbox_id          UUID,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at          TIMESTAMPTZ,
    ended_at            TIMESTAMPTZ
);
CREATE INDEX executions_agent ON executions (tenant_id, agent_id, created_at DESC);
CREATE INDEX executions_live ON executions (status) WHERE status IN ('pending', 'running');

CREATE TABLE execution_events (
    execution_id UUID NOT NULL REFERENCES executions(id) ON DELETE CASCADE,
    seq          BIGINT NOT NULL,
    event_type   TEXT NOT NULL,
    payload      JSONB NOT NULL DEFAULT '{}',
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, seq)
);
