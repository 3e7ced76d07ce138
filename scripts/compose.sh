#!/usr/bin/env bash
# Runs docker compose v2 (`docker compose`) where it exists, else docker-compose v1, with the
# arguments given, from the repository root (where docker-compose.yml and .env are):
#   scripts/compose.sh up -d        scripts/compose.sh exec orchestrator orchestrator admin-key
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if docker compose version >/dev/null 2>&1; then
  exec docker compose "$@"
elif command -v docker-compose >/dev/null 2>&1; then
  exec docker-compose "$@"
fi
echo "compose.sh: neither 'docker compose' (v2) nor 'docker-compose' (v1) is installed" >&2
exit 127
