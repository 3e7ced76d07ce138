-- Workflow scopes. A definition is `tenant` scoped (seen by its own tenant only, the default and
-- what every existing row becomes) or `global` (seen by every tenant). Only workflows can be global.
--
-- A global row keeps its tenant_id: that tenant still owns it, so only its operators may update,
-- delete or demote it, and demoting returns it where it came from. (AEGIS moves global rows to a
-- system tenant instead, which lets any tenant's operator take a global workflow into its own
-- tenant; keeping the owner avoids that.) Tenant-scoped names stay unique per tenant through
-- definitions_live_name; global names are unique across all tenants through the index below.

ALTER TABLE definitions
    ADD COLUMN scope TEXT NOT NULL DEFAULT 'tenant' CHECK (scope IN ('tenant', 'global'));

ALTER TABLE definitions
    ADD CONSTRAINT definitions_only_workflows_are_global CHECK (scope = 'tenant' OR kind = 'workflow');

CREATE UNIQUE INDEX definitions_live_global_name ON definitions (kind, name)
    WHERE scope = 'global' AND deleted_at IS NULL;

-- Every scope change, written in the same transaction as the change itself: who moved which
-- definition from where to where. The router's audit rows record the call; this is its readable
-- history (the audit log keeps only digests of arguments and results).
CREATE TABLE definition_scope_changes (
    id              UUID PRIMARY KEY,
    definition_id   UUID NOT NULL REFERENCES definitions(id),
    tenant_id       TEXT NOT NULL REFERENCES tenants(id),
    previous_scope  TEXT NOT NULL CHECK (previous_scope IN ('tenant', 'global')),
    new_scope       TEXT NOT NULL CHECK (new_scope IN ('tenant', 'global')),
    caller_kind     TEXT NOT NULL,
    caller_id       TEXT NOT NULL,
    changed_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (previous_scope <> new_scope)
);
CREATE INDEX definition_scope_changes_definition ON definition_scope_changes (definition_id, changed_at);
