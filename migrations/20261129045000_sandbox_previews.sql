-- Preview URLs of our own sandboxes (issue 45): a secret in a URL that lets a browser reach one
-- port of one sandbox until it expires or is revoked, decided as the key that made it. Only the
-- secret's SHA-256 is kept: the URL is answered once, at creation. The rows go with their
-- sandbox: when it ends (destroyed or failed) the trigger removes them, whichever path ended it.
CREATE TABLE sandbox_previews (
    id             UUID PRIMARY KEY,
    sandbox_id     UUID NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
    port           INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    secret_sha256  BYTEA NOT NULL UNIQUE,
    -- The API key that made it (`api_keys.id` as text, as the sandbox's owner id): the port's
    -- connections are decided and audited as this key.
    key_id         TEXT NOT NULL,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at     TIMESTAMPTZ NOT NULL,
    revoked_at     TIMESTAMPTZ
);

CREATE INDEX sandbox_previews_sandbox ON sandbox_previews (sandbox_id);

CREATE FUNCTION sandbox_previews_end() RETURNS trigger AS $$
BEGIN
    DELETE FROM sandbox_previews WHERE sandbox_id = NEW.id;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER sandbox_previews_end
    AFTER UPDATE OF state ON sandboxes
    FOR EACH ROW WHEN (NEW.state IN ('destroying', 'destroyed', 'failed'))
    EXECUTE FUNCTION sandbox_previews_end();
