-- What an E2B sandbox's timeout does (`autoPause` of its create, E2B's lifecycle `onTimeout`):
-- 'kill' (E2B's default) destroys it with its files; 'pause' keeps its files as a pause
-- snapshot, as `POST /sandboxes/{id}/pause` does, until a connect resumes it (api/e2b/store.rs,
-- `sweep`). It stays with the sandbox across a pause and a resume.
ALTER TABLE e2b_sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill'
    CHECK (on_timeout IN ('kill', 'pause'));

-- A running E2B sandbox's usage over time, as `GET /sandboxes/{id}/metrics` reports it with a
-- start and an end: one sample every 5 s (its `at` aligned to the 5 s bucket, as E2B's are),
-- taken from the container's cgroup by the replica holding the sandbox (api/e2b/observe.rs,
-- `sample`), kept for an hour and gone with the sandbox.
CREATE TABLE e2b_sandbox_metrics (
    e2b_id          UUID NOT NULL REFERENCES e2b_sandboxes (e2b_id) ON DELETE CASCADE,
    at              TIMESTAMPTZ NOT NULL,
    cpu_count       INTEGER NOT NULL,
    cpu_used_pct    DOUBLE PRECISION NOT NULL,
    mem_used        BIGINT NOT NULL,
    mem_total       BIGINT NOT NULL,
    mem_cache       BIGINT NOT NULL,
    disk_used       BIGINT NOT NULL,
    disk_total      BIGINT NOT NULL,
    PRIMARY KEY (e2b_id, at)
);

CREATE INDEX e2b_sandbox_metrics_at ON e2b_sandbox_metrics (at);
