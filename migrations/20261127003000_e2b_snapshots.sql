-- Pause, resume, snapshots and fork of the E2B door (api/e2b/snapshots.rs), with E2B's
-- filesystem-only semantics: what is saved is the sandbox's files, never its processes.
--
-- An E2B sandbox keeps its id across a pause and a resume, while the dispatcher's sandbox
-- behind it is a new one each time (a dispatcher id names one container for good). So the id
-- E2B clients see becomes a column of its own, `e2b_id`, and `sandbox_id` names the sandbox that
-- currently serves it (the last one, destroyed, while it is paused).
ALTER TABLE e2b_sandboxes ADD COLUMN e2b_id UUID;
UPDATE e2b_sandboxes SET e2b_id = sandbox_id;
ALTER TABLE e2b_sandboxes ALTER COLUMN e2b_id SET NOT NULL;
ALTER TABLE e2b_sandboxes ADD CONSTRAINT e2b_sandboxes_e2b_id_key UNIQUE (e2b_id);

-- Snapshots: the tar archive of a sandbox's workspace (rewritten as plain data when taken:
-- owners the sandbox user's, no set-id bits, no devices, no links out of it), kept in the
-- database rather than in a node directory so that every replica can resume or fork from it and
-- it survives the loss of a node's disk, bounded per key by the `e2b` config section and
-- deleted by the sweep when `expires_at` passes.
CREATE TABLE e2b_snapshots (
    id              UUID PRIMARY KEY,
    tenant_id       TEXT NOT NULL DEFAULT 'default' REFERENCES tenants (id),
    -- The API key that took it: the only key that may see, use or delete it.
    owner_key_id    TEXT NOT NULL,
    -- 'snapshot': taken on request, listed, starts sandboxes; 'pause': the files of a paused
    -- sandbox, used once by its resume and never listed.
    kind            TEXT NOT NULL CHECK (kind IN ('snapshot', 'pause')),
    -- The E2B id of the sandbox it was taken from.
    source_sandbox  UUID NOT NULL,
    -- The template its source was made from (reported), and the runtime (`language:version`)
    -- a sandbox started from it runs.
    template_id     TEXT NOT NULL,
    runtime         TEXT NOT NULL,
    name            TEXT,
    archive         BYTEA NOT NULL,
    bytes           BIGINT NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at      TIMESTAMPTZ NOT NULL
);

CREATE INDEX e2b_snapshots_owner ON e2b_snapshots (tenant_id, owner_key_id, created_at, id);
CREATE INDEX e2b_snapshots_expires_at ON e2b_snapshots (expires_at);

-- A paused sandbox names the snapshot it resumes from; when that snapshot expires, the paused
-- sandbox goes with it.
ALTER TABLE e2b_sandboxes ADD COLUMN paused_snapshot UUID
    REFERENCES e2b_snapshots (id) ON DELETE CASCADE;

-- What happened to an E2B sandbox, as `GET /v2/sandboxes/{id}/logs` reports it: its lifecycle
-- as the node saw it (created, paused, resumed, snapshot taken, forked), written by the door.
CREATE TABLE e2b_sandbox_logs (
    seq             BIGSERIAL PRIMARY KEY,
    e2b_id          UUID NOT NULL REFERENCES e2b_sandboxes (e2b_id) ON DELETE CASCADE,
    at              TIMESTAMPTZ NOT NULL DEFAULT now(),
    level           TEXT NOT NULL CHECK (level IN ('debug', 'info', 'warn', 'error')),
    message         TEXT NOT NULL,
    fields          JSONB NOT NULL DEFAULT '{}'::jsonb
);

CREATE INDEX e2b_sandbox_logs_by_sandbox ON e2b_sandbox_logs (e2b_id, at);
