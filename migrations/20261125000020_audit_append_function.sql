-- One round trip per audit batch. The writer (orchestrator/src/audit/writer.rs) used to spend three
-- on every batch: BEGIN with the chain's advisory lock, the INSERT, COMMIT. Under load a batch holds
-- one or two rows, so those round trips were most of PostgreSQL's work per audited call.
--
-- This function takes the lock and then inserts, in the caller's (implicit) transaction: called as
-- one statement in autocommit, the lock is held until that transaction commits. The INSERT is a
-- separate statement inside the function, so in READ COMMITTED it sees every row committed before
-- the lock was granted: the head check below is made against the true head, never a snapshot taken
-- before another replica's batch committed. It stores nothing when a head differs from the one the
-- writer chained to (the writer then reads the heads and chains again, in an explicit transaction).
CREATE FUNCTION audit_append(
    lock_key BIGINT,
    expect_tenants TEXT[], expect_hashes TEXT[],
    ids UUID[], tenants TEXT[], ats TIMESTAMPTZ[], caller_kinds TEXT[], caller_ids TEXT[],
    kinds TEXT[], actions TEXT[], decisions TEXT[], reason_codes TEXT[], reasons TEXT[],
    args_digests TEXT[], outcomes TEXT[], result_digests TEXT[], durations BIGINT[],
    intent_ids UUID[], chain_indexes BIGINT[], instance_ids UUID[], prev_hashes TEXT[],
    hashes TEXT[]
) RETURNS TABLE (stored_id UUID, stored_seq BIGINT)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    -- Rows are emitted in ordinal order, so `seq` (a sequence default) follows the chain.
    RETURN QUERY
    INSERT INTO audit_log AS a (id, tenant_id, at, caller_kind, caller_id, kind, action, decision,
        reason_code, reason, args_digest, outcome, result_digest, duration_ms, intent_id,
        chain_index, instance_id, prev_hash, hash)
    SELECT u.id, u.tenant_id, u.at, u.caller_kind, u.caller_id, u.kind, u.action, u.decision,
        u.reason_code, u.reason, u.args_digest, u.outcome, u.result_digest, u.duration_ms,
        u.intent_id, u.chain_index, u.instance_id, u.prev_hash, u.hash
    FROM UNNEST(ids, tenants, ats, caller_kinds, caller_ids, kinds, actions, decisions,
        reason_codes, reasons, args_digests, outcomes, result_digests, durations, intent_ids,
        chain_indexes, instance_ids, prev_hashes, hashes) WITH ORDINALITY
        AS u(id, tenant_id, at, caller_kind, caller_id, kind, action, decision, reason_code,
             reason, args_digest, outcome, result_digest, duration_ms, intent_id, chain_index,
             instance_id, prev_hash, hash, ord)
    WHERE NOT EXISTS (
        SELECT 1 FROM UNNEST(expect_tenants, expect_hashes) AS h(tenant, hash)
        WHERE (SELECT l.hash FROM audit_log l WHERE l.tenant_id = h.tenant
               ORDER BY l.tenant_id DESC, l.seq DESC LIMIT 1) IS DISTINCT FROM h.hash)
    ORDER BY u.ord
    RETURNING a.id, a.seq;
END
$$;
