-- Audit intents, chain anchoring, and the bookkeeping that scopes and bounds executions.

-- A call that runs leaves two chained rows: the intent (outcome 'running'), written before the
-- tool starts, and its completion, which names the intent it completes (hashed with the row).
ALTER TABLE audit_log ADD COLUMN intent_id UUID;
-- Position in the tenant's chain (1-based). Not hashed: verification checks it against the
-- position it counts, and the head (position + hash) is what operators publish as the anchor.
ALTER TABLE audit_log ADD COLUMN chain_index BIGINT;
-- The instance that wrote the row (not hashed): finds intents left open by an instance that died.
ALTER TABLE audit_log ADD COLUMN instance_id UUID;

UPDATE audit_log a SET chain_index = r.n
FROM (SELECT seq, row_number() OVER (PARTITION BY tenant_id ORDER BY seq) AS n FROM audit_log) r
WHERE a.seq = r.seq;

CREATE UNIQUE INDEX audit_log_completes ON audit_log (intent_id) WHERE intent_id IS NOT NULL;
CREATE INDEX audit_log_open_intents ON audit_log (tenant_id, seq) WHERE outcome = 'running';

-- The last row a verification found intact, per tenant: the next verification starts there
-- (after checking that row is still present with the same hash).
CREATE TABLE audit_checkpoints (
    tenant_id   TEXT PRIMARY KEY REFERENCES tenants(id),
    seq         BIGINT NOT NULL,
    chain_index BIGINT NOT NULL,
    hash        TEXT NOT NULL,
    verified_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Executions: how deep in a tree of child executions, and the principal (the non-execution
-- caller at the root of the tree) whose concurrent executions are bounded together.
ALTER TABLE executions ADD COLUMN depth INT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN principal TEXT;
UPDATE executions SET principal = caller_kind || ':' || caller_id WHERE principal IS NULL;
CREATE INDEX executions_parent ON executions (parent_execution_id) WHERE parent_execution_id IS NOT NULL;
CREATE INDEX executions_caller ON executions (tenant_id, caller_kind, caller_id);
CREATE INDEX executions_principal_live ON executions (principal) WHERE status IN ('pending', 'running');
