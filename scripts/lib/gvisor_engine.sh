#!/usr/bin/env bash
# A Docker engine with gVisor registered as the runtime `runsc`, beside the host's engine and
# beside the second engine of tests/suite/engines.rs, for gVisor sandboxes
# (`sandbox.isolation: gvisor`, tests/suite/gvisor.rs). The host's dockerd config is never
# touched. It is scripts/lib/second_engine.sh under names of its own (data root, runtime
# directory, bridge, address range, firewall tag and cgroup parent), with AEGIS_ENGINE2_RUNSC=1,
# so the same verbs apply:
#
#   scripts/lib/gvisor_engine.sh start [IMAGE...] | stop | purge | status
#
# Needs root and runsc (Debian's `runsc` package, installed by scripts/test.sh when missing).
# Settings: AEGIS_GVISOR_DIR (default /var/lib/aegis-gvisor), AEGIS_GVISOR_RUN (default
# /run/aegis-gvisor), AEGIS_GVISOR_BRIDGE (default aegis-gvisor), AEGIS_GVISOR_RANGE (default
# 10.214.0.0/16), AEGIS_GVISOR_TAG (default aegis-gvisor: its firewall rules' comment and cgroup
# parent). Change all five to run a second such engine beside the tests' (scripts/e2b_suite.sh
# does, with SUITE_ISOLATION=gvisor).
set -euo pipefail

export AEGIS_ENGINE2_DIR=${AEGIS_GVISOR_DIR:-/var/lib/aegis-gvisor}
export AEGIS_ENGINE2_RUN=${AEGIS_GVISOR_RUN:-/run/aegis-gvisor}
export AEGIS_ENGINE2_BRIDGE=${AEGIS_GVISOR_BRIDGE:-aegis-gvisor}
export AEGIS_ENGINE2_RANGE=${AEGIS_GVISOR_RANGE:-10.214.0.0/16}
export AEGIS_ENGINE2_TAG=${AEGIS_GVISOR_TAG:-aegis-gvisor}
export AEGIS_ENGINE2_RUNSC=1
exec bash "$(dirname "${BASH_SOURCE[0]}")/second_engine.sh" "$@"
