-- The sandbox a tool call ran in (or was refused for), so an operator can read one sandbox's
-- history (`GET /v1/audit?sandbox=`, the console's sandbox page). The id is covered by the row's
-- hash when present; rows without one hash exactly as before.
ALTER TABLE audit_log ADD COLUMN sandbox_id UUID;
CREATE INDEX audit_log_sandbox ON audit_log (tenant_id, sandbox_id, seq) WHERE sandbox_id IS NOT NULL;

-- audit_append with the rows' sandboxes. The older form stays for replicas still running the
-- previous release during a rolling restart (their rows have no sandbox).
CREATE FUNCTION audit_append(
    lock_key BIGINT,
    expect_tenants TEXT[], expect_hashes TEXT[],
    ids UUID[], tenants TEXT[], ats TIMESTAMPTZ[], caller_kinds TEXT[], caller_ids TEXT[],
    kinds TEXT[], actions TEXT[], decisions TEXT[], reason_codes TEXT[], reasons TEXT[],
    args_digests TEXT[], outcomes TEXT[], result_digests TEXT[], durations BIGINT[],
    intent_ids UUID[], chain_indexes BIGINT[], instance_ids UUID[], prev_hashes TEXT[],
    hashes TEXT[], sandbox_ids UUID[]
) RETURNS TABLE (stored_id UUID, stored_seq BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    -- Rows are emitted in ordinal order, so `seq` (a sequence default) follows the chain.
    RETURN QUERY
    INSERT INTO audit_log AS a (id, tenant_id, at, caller_kind, caller_id, kind, action, decision,
        reason_code, reason, args_digest, outcome, result_digest, duration_ms, intent_id,
        chain_index, instance_id, prev_hash, hash, sandbox_id)
    SELECT u.id, u.tenant_id, u.at, u.caller_kind, u.caller_id, u.kind, u.action, u.decision,
        u.reason_code, u.reason, u.args_digest, u.outcome, u.result_digest, u.duration_ms,
        u.intent_id, u.chain_index, u.instance_id, u.prev_hash, u.hash, u.sandbox_id
    FROM UNNEST(ids, tenants, ats, caller_kinds, caller_ids, kinds, actions, decisions,
        reason_codes, reasons, args_digests, outcomes, result_digests, durations, intent_ids,
        chain_indexes, instance_ids, prev_hashes, hashes, sandbox_ids) WITH ORDINALITY
        AS u(id, tenant_id, at, caller_kind, caller_id, kind, action, decision, reason_code,
             reason, args_digest, outcome, result_digest, duration_ms, intent_id, chain_index,
             instance_id, prev_hash, hash, sandbox_id, ord)
    WHERE NOT EXISTS (
        SELECT 1 FROM UNNEST(expect_tenants, expect_hashes) AS h(tenant, hash)
        WHERE (SELECT l.hash FROM audit_log l WHERE l.tenant_id = h.tenant
               ORDER BY l.tenant_id DESC, l.seq DESC LIMIT 1) IS DISTINCT FROM h.hash)
    ORDER BY u.ord
    RETURNING a.id, a.seq;
END
$$;
