-- Agent memory across executions (spec.execution.memory): the notes an agent chose to keep with
-- aegis.memory.write, one row per note. A memory is (tenant, agent name, owner): the owner is the
-- principal at the root of the execution tree that wrote the note (`api_key:<id>`,
-- `session:<id>`, ...), or `*` for an agent whose manifest shares one memory among all
-- principals. Names, not agent ids: a memory outlives a redeploy and a delete of its agent, and
-- operators list and erase it by name.
CREATE TABLE agent_memories (
    id            UUID PRIMARY KEY,
    tenant_id     TEXT NOT NULL DEFAULT 'default' REFERENCES tenants(id),
    agent_name    TEXT NOT NULL,
    owner         TEXT NOT NULL,
    content       TEXT NOT NULL CHECK (length(content) > 0),
    -- A JSON array of short keywords (JSON rather than TEXT[]: its text form is immutable, so
    -- the generated search vector below may use it).
    tags          JSONB NOT NULL DEFAULT '[]' CHECK (jsonb_typeof(tags) = 'array'),
    execution_id  UUID,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- What recall ranks: tags weigh more than the note's words. Generated, so no write path
    -- can forget it.
    search_vector tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', tags::text), 'A')
        || setweight(to_tsvector('english', content), 'B')
    ) STORED
);

-- One memory's notes, newest first (listing, counting against memory.max_notes_per_scope).
CREATE INDEX agent_memories_scope ON agent_memories (tenant_id, agent_name, owner, created_at DESC);
-- A note equal to one the memory holds is not stored twice.
CREATE UNIQUE INDEX agent_memories_distinct ON agent_memories (tenant_id, agent_name, owner, md5(content));
CREATE INDEX agent_memories_search ON agent_memories USING GIN (search_vector);
