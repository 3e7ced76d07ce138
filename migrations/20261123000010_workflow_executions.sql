-- Workflow executions: a durable state machine per run, advanced by whichever replica holds its
-- lease, and its append-only, gap-free event log.
--
-- A row is claimed with SELECT ... FOR UPDATE SKIP LOCKED and held by a lease (lease_owner =
-- the holder's instance id, lease_expires_at renewed while a state runs). Every commit of a
-- state's output checks `lease_owner = me` in the same transaction that writes the blackboard,
-- the events and the next state, so a replica that lost its lease can never commit.

CREATE TABLE workflow_executions (
    id                  UUID PRIMARY KEY,
    tenant_id           TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    workflow_id         UUID NOT NULL,
    workflow_version_id UUID NOT NULL,
    workflow_name       TEXT NOT NULL,
    workflow_version    TEXT NOT NULL,
    -- Subworkflow children: the parent execution and the state (and visit) that started them.
    parent_execution_id UUID,
    parent_state        TEXT,
    parent_visit        INT,
    status              TEXT NOT NULL DEFAULT 'pending'
                        CHECK (status IN ('pending', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'timed_out')),
    current_state       TEXT NOT NULL,
    -- state name -> times entered (the current entry included).
    visits              JSONB NOT NULL DEFAULT '{}',
    transition_count    INT NOT NULL DEFAULT 0,
    blackboard          JSONB NOT NULL DEFAULT '{}',
    input               JSONB NOT NULL DEFAULT '{}',
    intent              TEXT,
    caller_kind         TEXT NOT NULL,
    caller_id           TEXT NOT NULL,
    lease_owner         UUID,
    lease_expires_at    TIMESTAMPTZ,
    -- How many times a worker began running the current entry of current_state: above 1, an
    -- earlier attempt was interrupted and what it started is removed before the state runs again.
    attempt             INT NOT NULL DEFAULT 0,
    -- The feedback template of the transition that entered current_state, rendered.
    state_feedback      TEXT,
    state_entered_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- While waiting: what for (`human`, `subworkflow`) and when to look again (timeouts).
    waiting_for         TEXT CHECK (waiting_for IN ('human', 'subworkflow')),
    wake_at             TIMESTAMPTZ,
    -- A Human state's answer, stored by aegis.workflow.signal until the state consumes it.
    signal              TEXT,
    cancel_requested    BOOLEAN NOT NULL DEFAULT FALSE,
    final_output        JSONB,
    error               TEXT,
    -- The sequence number the next event gets; bumped under this row's lock (gap-free log).
    next_seq            BIGINT NOT NULL DEFAULT 1,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at          TIMESTAMPTZ,
    last_transition_at  TIMESTAMPTZ,
    ended_at            TIMESTAMPTZ,
    -- The whole execution fails as timed_out past this instant (node workflows.max_execution_secs).
    deadline            TIMESTAMPTZ NOT NULL
);

-- Workers look for runnable rows: live statuses only, oldest first.
CREATE INDEX workflow_executions_live ON workflow_executions (created_at)
    WHERE status IN ('pending', 'running', 'waiting');
CREATE INDEX workflow_executions_by_workflow ON workflow_executions (tenant_id, workflow_id, created_at DESC);
CREATE INDEX workflow_executions_children ON workflow_executions (parent_execution_id, parent_state, parent_visit)
    WHERE parent_execution_id IS NOT NULL;

CREATE TABLE workflow_execution_events (
    execution_id UUID NOT NULL REFERENCES workflow_executions(id) ON DELETE CASCADE,
    seq          BIGINT NOT NULL,
    event_type   TEXT NOT NULL,
    state_name   TEXT,
    payload      JSONB NOT NULL DEFAULT '{}',
    recorded_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, seq)
);

-- Agent executions started by a workflow state carry (execution, state, visit), so a state that
-- runs again after a crash can cancel what its interrupted attempt started.
ALTER TABLE executions
    ADD COLUMN workflow_execution_id UUID,
    ADD COLUMN workflow_state TEXT,
    ADD COLUMN workflow_visit INT;
CREATE INDEX executions_workflow_state ON executions (workflow_execution_id, workflow_state, workflow_visit)
    WHERE workflow_execution_id IS NOT NULL;

-- Sandboxes of workflow states (ContainerRun, System) are owned by `workflow` owners.
ALTER TABLE sandboxes DROP CONSTRAINT sandboxes_owner_kind_check;
ALTER TABLE sandboxes ADD CONSTRAINT sandboxes_owner_kind_check
    CHECK (owner_kind IN ('execution', 'session', 'operator', 'pool', 'workflow'));
