-- What an E2B sandbox's timeout does (`autoPause` of its create, E2B's lifecycle `onTimeout`):
-- 'kill' (E2B's default) destroys it with its files; 'pause' keeps its files as a pause
-- snapshot, as `POST /sandboxes/{id}/pause` does, until a connect resumes it (api/e2b/store.rs,
-- `sweep`). It stays with the sandbox across a pause and a resume.
ALTER TABLE e2b_sandboxes ADD COLUMN on_timeout TEXT NOT NULL DEFAULT 'kill'
    CHECK (on_timeout IN ('kill', 'pause'));
