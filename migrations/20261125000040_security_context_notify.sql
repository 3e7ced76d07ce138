-- Every edit or deletion of a security context is announced on `aegis_security_contexts`
-- (payload: the context's name), in the changing transaction, whoever makes it. Nodes cache the
-- MCP keys bound to a context together with the context's version only while they listen
-- (orchestrator/src/auth/key_cache.rs), and drop those keys when their context is announced, so
-- an edit applies to the next MCP call on every replica. A new context needs no announcement:
-- a key bound to a missing context is refused, and refusals are never cached.
CREATE FUNCTION security_contexts_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aegis_security_contexts', OLD.name);
    RETURN NULL;
END
$$;

CREATE TRIGGER security_contexts_changed AFTER UPDATE OR DELETE ON security_contexts FOR EACH ROW
EXECUTE FUNCTION security_contexts_notify();
