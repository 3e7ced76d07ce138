-- Workflow volumes (spec.storage): the files the states of one run share.
--
-- A volume belongs to one execution. Between states its content is a tar archive here, so any
-- replica continues a run, also after a crash; while a state runs it is a directory of that
-- state's sandbox workspace. A state's changes are first a draft of (state, visit, attempt) and
-- become the volume's content only in the transaction that commits the state (fenced by the
-- lease, see workflow/store.rs): an interrupted attempt, or a stalled replica that lost its
-- lease, leaves a draft that is never promoted, and the retry starts from the committed content.
--
-- An ephemeral volume (keep_hours = 0) is removed when its execution ends; a persistent one gets
-- expires_at = end + keep_hours then and is removed by the sweep; either goes with its execution
-- when that is removed.

CREATE TABLE workflow_volumes (
    execution_id      UUID NOT NULL REFERENCES workflow_executions(id) ON DELETE CASCADE,
    name              TEXT NOT NULL,
    tenant_id         TEXT NOT NULL REFERENCES tenants(id),
    size_limit_bytes  BIGINT NOT NULL CHECK (size_limit_bytes > 0),
    keep_hours        INT NOT NULL DEFAULT 0 CHECK (keep_hours >= 0),
    content           BYTEA NOT NULL DEFAULT '',
    content_bytes     BIGINT NOT NULL DEFAULT 0,
    -- The state (and visit) whose commit wrote this content.
    written_by_state  TEXT NOT NULL,
    written_by_visit  INT NOT NULL,
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- Set when the execution ends (persistent volumes only); NULL while it runs.
    expires_at        TIMESTAMPTZ,
    PRIMARY KEY (execution_id, name)
);
CREATE INDEX workflow_volumes_expiry ON workflow_volumes (expires_at) WHERE expires_at IS NOT NULL;

CREATE TABLE workflow_volume_drafts (
    execution_id      UUID NOT NULL REFERENCES workflow_executions(id) ON DELETE CASCADE,
    name              TEXT NOT NULL,
    state             TEXT NOT NULL,
    visit             INT NOT NULL,
    attempt           INT NOT NULL,
    tenant_id         TEXT NOT NULL REFERENCES tenants(id),
    size_limit_bytes  BIGINT NOT NULL CHECK (size_limit_bytes > 0),
    keep_hours        INT NOT NULL DEFAULT 0 CHECK (keep_hours >= 0),
    content           BYTEA NOT NULL,
    content_bytes     BIGINT NOT NULL,
    written_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (execution_id, name, state, visit, attempt)
);
