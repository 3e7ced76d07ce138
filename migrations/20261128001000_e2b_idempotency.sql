-- E2B's v2 create takes an `Idempotency-Key`: a retried create with the same key (from the same
-- API key) answers the sandbox the first one made, never a second sandbox. The claim is taken
-- before the sandbox is made (the primary key serialises racing retries); `answer` is written
-- once it exists, and a failed create deletes its claim so a retry may try again.
CREATE TABLE e2b_idempotency (
    owner_key_id    TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    -- SHA-256 of the request body: the same key with another body is refused.
    body_digest     TEXT NOT NULL,
    -- The create's answer (the sandbox), absent while the create runs.
    answer          JSONB,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (owner_key_id, idempotency_key)
);
