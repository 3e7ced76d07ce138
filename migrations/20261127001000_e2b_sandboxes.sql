-- Sandboxes made through the E2B door (api/e2b): what E2B's control API reports and decides on
-- top of the dispatcher's row in `sandboxes` (which holds the container, its state and spec).
-- A row is written only once its sandbox runs, in the create request that made it, and is
-- removed with the sandbox (kill, or the sweep when `end_at` passes), so a listing never shows
-- a sandbox that is not there.
CREATE TABLE e2b_sandboxes (
    sandbox_id      UUID PRIMARY KEY REFERENCES sandboxes (id) ON DELETE CASCADE,
    tenant_id       TEXT NOT NULL DEFAULT 'default' REFERENCES tenants (id),
    -- The API key that created it: the only key that may see, use or end it.
    owner_key_id    TEXT NOT NULL,
    -- The template id as asked (`base`, `python`, `python:3.11`).
    template_id     TEXT NOT NULL,
    metadata        JSONB NOT NULL DEFAULT '{}'::jsonb,
    env_vars        JSONB NOT NULL DEFAULT '{}'::jsonb,
    allow_internet_access BOOLEAN,
    -- A secure sandbox's envd access token. Kept as issued, not hashed: the signed /files URLs
    -- the SDK builds are SHA-256 over the path and this token, so checking one needs the token.
    envd_access_token TEXT,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- When the sandbox is killed unless its timeout is set again (timeout, connect).
    end_at          TIMESTAMPTZ NOT NULL
);

CREATE INDEX e2b_sandboxes_owner ON e2b_sandboxes (tenant_id, owner_key_id, started_at, sandbox_id);
CREATE INDEX e2b_sandboxes_end_at ON e2b_sandboxes (end_at);
