-- Result deliveries (spec.execution.delivery): one row per (execution, destination) with the
-- request rendered when the execution ended, so every retry sends the same bytes. Workers on any
-- replica claim due rows (FOR UPDATE SKIP LOCKED) under a lease; a row left 'sending' by a dead
-- replica is claimed again once its lease expires. Each attempt is a row of delivery_attempts.
CREATE TABLE deliveries (
    id                UUID PRIMARY KEY,
    tenant_id         TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    execution_id      UUID NOT NULL,
    destination       TEXT NOT NULL,
    kind              TEXT NOT NULL CHECK (kind IN ('webhook', 'rest')),
    url               TEXT NOT NULL,
    method            TEXT NOT NULL,
    headers           JSONB NOT NULL DEFAULT '{}',
    secret_name       TEXT,
    content_type      TEXT NOT NULL,
    body              TEXT NOT NULL,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'sending', 'delivered', 'failed')),
    attempts          INT NOT NULL DEFAULT 0,
    max_attempts      INT NOT NULL CHECK (max_attempts >= 1),
    next_attempt_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    lease_owner       UUID,
    lease_expires_at  TIMESTAMPTZ,
    last_status_code  INT,
    last_error        TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    delivered_at      TIMESTAMPTZ
);
CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE status IN ('pending', 'sending');
CREATE INDEX deliveries_execution ON deliveries (execution_id);

CREATE TABLE delivery_attempts (
    delivery_id  UUID NOT NULL REFERENCES deliveries(id) ON DELETE CASCADE,
    attempt      INT NOT NULL,
    at           TIMESTAMPTZ NOT NULL DEFAULT now(),
    status_code  INT,
    error        TEXT,
    duration_ms  BIGINT NOT NULL,
    PRIMARY KEY (delivery_id, attempt)
);
