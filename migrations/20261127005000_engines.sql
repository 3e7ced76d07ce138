-- Several Docker engines (issue 23): which engine each replica drives and each sandbox lives on.
-- `engine` is the Docker daemon's identity (`<ID>@<name>:<data root>` from `docker info`), the
-- same for every replica driving that daemon, so replicas beside one engine agree without
-- naming it. NULL: written before this migration (that sandbox or instance is on the engine of
-- whoever reads it: the one-engine world).
ALTER TABLE node_instances ADD COLUMN engine TEXT;
ALTER TABLE sandboxes ADD COLUMN engine TEXT;
-- Placement counts the live sandboxes of each engine.
CREATE INDEX sandboxes_live_by_engine ON sandboxes (engine)
    WHERE state IN ('creating', 'running', 'destroying');
