-- Versions are immutable. A deployed version's row is never rewritten: deploying an existing
-- version again with `force` and a different manifest adds a new *revision* of that version (a
-- new row, revision + 1); the same manifest again changes nothing. Lookups by name and version
-- take the highest revision; executions keep pointing at the exact row they ran
-- (agent_version_id, workflow_version_id) and record its revision and digest.
--
-- manifest_digest is `sha256:` + the hex SHA-256 of manifest_yaml (UTF-8), the normalised YAML
-- that export returns, so anyone can recompute it from an export.

ALTER TABLE definition_versions
    ADD COLUMN revision INT NOT NULL DEFAULT 1 CHECK (revision >= 1),
    ADD COLUMN manifest_digest TEXT;
UPDATE definition_versions
    SET manifest_digest = 'sha256:' || encode(sha256(convert_to(manifest_yaml, 'UTF8')), 'hex');
ALTER TABLE definition_versions ALTER COLUMN manifest_digest SET NOT NULL;
ALTER TABLE definition_versions DROP CONSTRAINT definition_versions_definition_id_version_key;
ALTER TABLE definition_versions
    ADD CONSTRAINT definition_versions_revision_key UNIQUE (definition_id, version, revision);

-- What a version means can no longer change, whoever writes: a row's content columns refuse
-- every UPDATE (scope and tenant bookkeeping stay writable).
CREATE FUNCTION definition_versions_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'definition version % (% revision %) is immutable: deploy a new version, or a new revision with force',
        OLD.id, OLD.version, OLD.revision
        USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER definition_versions_immutable
    BEFORE UPDATE OF definition_id, version, revision, manifest, manifest_yaml, manifest_digest
    ON definition_versions FOR EACH ROW EXECUTE FUNCTION definition_versions_immutable();

-- Every execution records the revision and digest of the manifest it ran. Rows from before this
-- migration get them only where the version was not overwritten after they started (before,
-- `force` rewrote rows in place); otherwise what they ran is not known and both stay NULL.
ALTER TABLE executions
    ADD COLUMN agent_revision INT,
    ADD COLUMN manifest_digest TEXT;
UPDATE executions e SET agent_revision = v.revision, manifest_digest = v.manifest_digest
    FROM definition_versions v
    WHERE v.id = e.agent_version_id AND v.updated_at <= e.created_at;

ALTER TABLE workflow_executions
    ADD COLUMN workflow_revision INT,
    ADD COLUMN manifest_digest TEXT;
UPDATE workflow_executions e SET workflow_revision = v.revision, manifest_digest = v.manifest_digest
    FROM definition_versions v
    WHERE v.id = e.workflow_version_id AND v.updated_at <= e.created_at;
