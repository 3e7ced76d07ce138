-- Ticks of workflows' spec.default_schedule. Every replica's scheduler tries to INSERT the row of a
-- tick it sees due; the primary key lets exactly one INSERT win, and only the winner starts that
-- tick's run: one run per (workflow, tick) cluster-wide, however many replicas serve.
CREATE TABLE workflow_schedule_ticks (
    definition_id UUID NOT NULL REFERENCES definitions(id),
    tick          TIMESTAMPTZ NOT NULL,
    tenant_id     TEXT NOT NULL REFERENCES tenants(id),
    instance_id   UUID NOT NULL,
    -- The run the tick started, or why none could start (input_schema, missing agents, ...).
    execution_id  UUID,
    error         TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (definition_id, tick)
);
