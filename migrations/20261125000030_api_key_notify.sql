-- Every change of an API key that can change what it may do is announced on `aegis_api_keys`
-- (payload: the key's id), in the changing transaction, whoever makes it (the API, the CLI, psql).
-- Nodes cache verified keys only while they listen (orchestrator/src/auth/key_cache.rs) and drop
-- a key when it is announced, so a revocation applies on every replica at once. Refreshing
-- `last_used_at` is not announced.
CREATE FUNCTION api_keys_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('aegis_api_keys', OLD.id::text);
    RETURN NULL;
END
$$;

CREATE TRIGGER api_keys_changed AFTER UPDATE ON api_keys FOR EACH ROW
WHEN (OLD.id IS DISTINCT FROM NEW.id
   OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id
   OR OLD.name IS DISTINCT FROM NEW.name
   OR OLD.role IS DISTINCT FROM NEW.role
   OR OLD.key_hash IS DISTINCT FROM NEW.key_hash
   OR OLD.expires_at IS DISTINCT FROM NEW.expires_at
   OR OLD.revoked_at IS DISTINCT FROM NEW.revoked_at
   OR OLD.security_context IS DISTINCT FROM NEW.security_context)
EXECUTE FUNCTION api_keys_notify();

CREATE TRIGGER api_keys_deleted AFTER DELETE ON api_keys FOR EACH ROW
EXECUTE FUNCTION api_keys_notify();
