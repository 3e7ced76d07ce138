-- An API key may be bound by an operator to one security context: such a key opens MCP
-- sessions (`/mcp`) whose calls that context narrows, like a SEAL session's. NULL: not usable on
-- `/mcp` (operator keys keep their REST meaning only).
ALTER TABLE api_keys ADD COLUMN security_context TEXT;
