-- Search over agents and workflows (aegis.agent.search, aegis.workflow.search), in PostgreSQL
-- alone: full-text ranking over what a definition says it is and does, plus trigram similarity
-- of names for typos. pg_trgm ships with PostgreSQL (Debian's postgresql-15 package and the
-- postgres:15-bookworm image both include the contrib modules).
CREATE EXTENSION IF NOT EXISTS pg_trgm;

-- The searchable text of a version, derived from its manifest by PostgreSQL itself (a generated
-- column: no deploy path can forget to maintain it). Weights: A the name, B the description,
-- C labels, tools and workflow state kinds and names, D the instructions and prompts.
ALTER TABLE definition_versions
    ADD COLUMN search_vector tsvector GENERATED ALWAYS AS (
        setweight(to_tsvector('english', coalesce(manifest #>> '{metadata,name}', '')), 'A')
        || setweight(to_tsvector('english', coalesce(manifest #>> '{metadata,description}', '')), 'B')
        || setweight(to_tsvector('english',
               coalesce(jsonb_path_query_array(manifest, '$.metadata.labels.*')::text, '')
               || ' ' || coalesce(jsonb_path_query_array(manifest, '$.spec.tools[*]')::text, '')
               || ' ' || coalesce(jsonb_path_query_array(manifest, '$.spec.states.*.kind')::text, '')
               || ' ' || coalesce(jsonb_path_query_array(manifest, '$.spec.states.keyvalue().key')::text, '')
           ), 'C')
        || setweight(to_tsvector('english',
               coalesce(manifest #>> '{spec,task,instruction}', '')
               || ' ' || coalesce(manifest #>> '{spec,task,prompt_template}', '')
               || ' ' || coalesce(jsonb_path_query_array(manifest, '$.spec.states.*.prompt')::text, '')
               || ' ' || coalesce(jsonb_path_query_array(manifest, '$.spec.states.*.input')::text, '')
           ), 'D')
    ) STORED;

CREATE INDEX definition_versions_search ON definition_versions USING GIN (search_vector);
CREATE INDEX definitions_name_trgm ON definitions USING GIN (name gin_trgm_ops);
