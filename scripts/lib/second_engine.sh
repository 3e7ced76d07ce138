#!/usr/bin/env bash
# A second Docker engine on this machine, for the multi-engine scenario (tests/suite/engines.rs)
# and for trying placement by hand. Usage:
#
#   scripts/lib/second_engine.sh start [IMAGE...]  # start it (idempotent), load the images into it,
#                                                  # print its address (unix:///.../docker.sock)
#   scripts/lib/second_engine.sh stop              # remove its containers and networks, stop it,
#                                                  # leave no process, mount, bridge or rule behind
#   scripts/lib/second_engine.sh purge             # stop, then delete its data root (images too)
#   scripts/lib/second_engine.sh status            # exit 0 and print the address when it answers
#
# The engine is a dockerd of its own beside the host's: its own data root, exec root (netns,
# containerd and its shims), pid file, Unix socket, cgroup parent and default bridge, and
# the same storage driver as the host's engine (fuse-overlayfs, overlay2, ... whatever works
# here). Images are never pulled: each IMAGE (default aegis-runtime/busybox:1) is copied from
# the host's engine with `docker save | docker load` when the second engine lacks it or has
# another build. The executor volume needs nothing from here: the node that drives an engine
# installs it there itself (dispatcher/src/install.rs), with one of these images as its helper.
#
# Firewall: the second daemon runs with --iptables=false. A dockerd that manages iptables
# removes and rebuilds the DOCKER and DOCKER-ISOLATION chains when it starts, which would drop
# the host engine's rules for its own networks (the isolation of its internal networks among
# them). Instead this script adds two rules of its own, tagged `aegis-engine2`, that refuse all
# forwarding to and from the second engine's address range (its bridge and every network it
# makes), so an internal network there has no way out but the host itself, where the node's
# per-network rules (`aegis-egress:<network>`, dispatcher/src/network.rs) admit only its
# egress proxy, exactly as on the host's engine. No NAT: nothing there routes out.
#
# The host's docker0: dockerd 20.10, when it starts with --default-address-pool, without
# live-restore, and finds a default "bridge" network in its store from an earlier run, deletes the
# link named docker0 (a name it hard-codes), which is the host engine's bridge. So this engine
# starts with live-restore on and without the network store of its previous run (stop removes its
# networks anyway), and start checks that docker0 is still there afterwards.
#
# Settings (environment): AEGIS_ENGINE2_DIR (data root's parent, default /var/lib/aegis-engine2),
# AEGIS_ENGINE2_RUN (runtime directory, default /run/aegis-engine2), AEGIS_ENGINE2_BRIDGE
# (default aegis-eng2), AEGIS_ENGINE2_RANGE (default 10.213.0.0/16: the bridge takes the first
# /24, networks come from the upper half in /24s), AEGIS_ENGINE2_TAG (default aegis-engine2: the
# firewall rules' comment and the cgroup parent, so two such engines never touch each other's),
# AEGIS_ENGINE2_RUNSC (default 0; 1 registers gVisor's runsc as the runtime `runsc`, see
# scripts/lib/gvisor_engine.sh, which starts such an engine under names of its own, and turns on
# the engine's experimental features, which checkpoints need: pause with memory, unless
# AEGIS_ENGINE2_EXPERIMENTAL=false). Needs root.
set -euo pipefail

DIR=${AEGIS_ENGINE2_DIR:-/var/lib/aegis-engine2}
RUN=${AEGIS_ENGINE2_RUN:-/run/aegis-engine2}
BRIDGE=${AEGIS_ENGINE2_BRIDGE:-aegis-eng2}
RANGE=${AEGIS_ENGINE2_RANGE:-10.213.0.0/16}
TAG=${AEGIS_ENGINE2_TAG:-aegis-engine2}
RUNSC=${AEGIS_ENGINE2_RUNSC:-0}
EXPERIMENTAL=${AEGIS_ENGINE2_EXPERIMENTAL:-true}
case "$EXPERIMENTAL" in true | false) ;; *) echo "[engine2] ERROR: AEGIS_ENGINE2_EXPERIMENTAL must be true or false (got $EXPERIMENTAL)" >&2; exit 1 ;; esac
SOCKET="$RUN/docker.sock"
HOST="unix://$SOCKET"
PIDFILE="$RUN/dockerd.pid"
LOG="$RUN/dockerd.log"

say() { printf '[engine2] %s\n' "$*" >&2; }
die() { printf '[engine2] ERROR: %s\n' "$*" >&2; exit 1; }

# 10.213.0.0/16 -> prefix "10.213"; the range must be a /16 (bridge /24 + a /17 of /24s).
case "$RANGE" in
  */16) prefix=${RANGE%.0.0/16} ;;
  *) die "AEGIS_ENGINE2_RANGE must be a /16 (got $RANGE)" ;;
esac
BRIDGE_CIDR="$prefix.0.1/24"
POOL="$prefix.128.0/17"

d2() { docker -H "$HOST" "$@"; }

answers() { [ -S "$SOCKET" ] && timeout 10 docker -H "$HOST" version >/dev/null 2>&1; }

daemon_pid() {
  local pid
  [ -f "$PIDFILE" ] || return 1
  pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
  # The pid file may be stale and the number reused: it must be our dockerd.
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "--exec-root $RUN/exec" || return 1
  echo "$pid"
}

# Firewall: refuse forwarding to and from the range (inserted first, idempotent).
add_rules() {
  local dir
  for dir in -s -d; do
    iptables -w -C FORWARD "$dir" "$RANGE" -m comment --comment "$TAG" -j DROP 2>/dev/null \
      || iptables -w -I FORWARD 1 "$dir" "$RANGE" -m comment --comment "$TAG" -j DROP
  done
}

# Removes every INPUT/FORWARD rule whose comment is exactly `tag` (iptables -S prints it bare).
remove_tagged() {
  local tables=$1 chain=$2 tag=$3 rule
  command -v "$tables" >/dev/null || return 0
  { "$tables" -w -S "$chain" 2>/dev/null || true; } | { grep -E -- "--comment \"?$tag\"?( |\$)" || true; } |
    tr -d '"' | sed 's/^-A /-D /' | while read -r rule; do
      # shellcheck disable=SC2086  # a rule is words without spaces inside
      "$tables" -w $rule >/dev/null 2>&1 || true
    done
}

make_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add name "$BRIDGE" type bridge
  fi
  ip -4 addr show dev "$BRIDGE" | grep -qF " $BRIDGE_CIDR " || ip addr replace "$BRIDGE_CIDR" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

# Whether a second engine can run here at all; says exactly why not.
preflight() {
  [ "$(id -u)" = 0 ] || die "needs root (a dockerd, a bridge and firewall rules)"
  command -v dockerd >/dev/null || die "dockerd is not installed"
  command -v iptables >/dev/null || die "iptables is not installed (the second engine's forwarding rules)"
  timeout 20 docker info >/dev/null 2>&1 || die "the host's Docker engine does not answer (images come from it)"
  iptables -w -S FORWARD >/dev/null 2>&1 || die "cannot read the host firewall (iptables -S FORWARD failed)"
  if [ "$RUNSC" = 1 ]; then
    command -v runsc >/dev/null || die "runsc (gVisor) is not installed: apt-get install runsc"
  fi
  if ip route | grep -qE "^$prefix\.[0-9]+\.[0-9]+/" && ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "$RANGE is already routed on this host; choose another with AEGIS_ENGINE2_RANGE"
  fi
}

start() {
  preflight
  local driver
  driver=$(docker info --format '{{.Driver}}')
  mkdir -p "$DIR/data" "$RUN/exec"
  chmod 0711 "$DIR" "$RUN"
  make_bridge
  add_rules
  if ! daemon_pid >/dev/null; then
    rm -f "$SOCKET" "$PIDFILE"
    # No network store from an earlier run (see the docker0 note above).
    rm -f "$DIR/data/network/files/local-kv.db"
    local had_docker0=0
    ip link show docker0 >/dev/null 2>&1 && had_docker0=1
    # Our own config file: the host's /etc/docker/daemon.json (data-root, ...) would conflict.
    # Docker 20.10 derives the engine ID (`docker info` .ID) from /etc/docker/key.json, which
    # both daemons would share: this one gets a key of its own (newer engines ignore the key).
    # With AEGIS_ENGINE2_RUNSC=1, gVisor as the runtime `runsc`: the ptrace platform (KVM hangs
    # on these machines) and runsc's own --network=none, without which a container of Docker's
    # `--network=none` fails ("cannot run with network enabled in root network namespace").
    local runtimes=""
    if [ "$RUNSC" = 1 ]; then
      runtimes=",
 \"runtimes\": {\"runsc\": {\"path\": \"$(command -v runsc)\",
   \"runtimeArgs\": [\"--platform=ptrace\", \"--network=none\"]}},
 \"experimental\": $EXPERIMENTAL"
    fi
    cat >"$RUN/daemon.json" <<EOF
{"log-driver": "json-file", "log-opts": {"max-size": "10m", "max-file": "2"},
 "deprecated-key-path": "$DIR/key.json"$runtimes}
EOF
    say "starting dockerd ($driver) on $HOST, data root $DIR/data, bridge $BRIDGE ($BRIDGE_CIDR)"
    # setsid: its own session, so it outlives the caller's shell and never gets its signals.
    setsid dockerd \
      --config-file "$RUN/daemon.json" \
      --data-root "$DIR/data" \
      --exec-root "$RUN/exec" \
      --pidfile "$PIDFILE" \
      --host "$HOST" \
      --storage-driver "$driver" \
      --bridge "$BRIDGE" \
      --default-address-pool "base=$POOL,size=24" \
      --iptables=false --ip6tables=false --ip-masq=false --ip-forward=false \
      --cgroup-parent "/$TAG" \
      --mtu "$(cat "/sys/class/net/$(ip route show default | awk '{print $5; exit}')/mtu" 2>/dev/null || echo 1500)" \
      --live-restore=true \
      </dev/null >"$LOG" 2>&1 &
    local i
    for i in $(seq 60); do
      answers && break
      if ! kill -0 "$!" 2>/dev/null; then
        tail -n 30 "$LOG" >&2
        die "dockerd exited at start (log above, $LOG)"
      fi
      sleep 1
    done
    answers || { tail -n 30 "$LOG" >&2; die "dockerd did not answer on $HOST within 60 s ($LOG)"; }
    if [ "$had_docker0" = 1 ] && ! ip link show docker0 >/dev/null 2>&1; then
      die "the host engine's docker0 bridge disappeared while this engine started; stop it ($0 stop) and restore docker0"
    fi
  fi
  local image ours theirs
  for image in "${@:-aegis-runtime/busybox:1}"; do
    theirs=$(docker image inspect --format '{{.Id}}' "$image" 2>/dev/null) \
      || die "image $image is not on the host's engine (build it: runtime-images/build.sh)"
    ours=$(d2 image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
    if [ "$ours" != "$theirs" ]; then
      say "loading $image"
      docker save "$image" | d2 load >/dev/null
    fi
  done
  echo "$HOST"
}

stop() {
  [ "$(id -u)" = 0 ] || die "needs root"
  local pid net
  if answers; then
    d2 ps -aq | xargs -r docker -H "$HOST" rm -f -v >/dev/null 2>&1 || true
    for net in $(d2 network ls --filter type=custom --format '{{.Name}}'); do
      d2 network rm "$net" >/dev/null 2>&1 || true
      remove_tagged iptables INPUT "aegis-egress:$net"
      remove_tagged ip6tables INPUT "aegis-egress:$net"
    done
    d2 volume ls -q | xargs -r docker -H "$HOST" volume rm -f >/dev/null 2>&1 || true
  fi
  if pid=$(daemon_pid); then
    say "stopping dockerd ($pid)"
    kill -TERM "$pid"
    local i
    for i in $(seq 30); do
      [ -d "/proc/$pid" ] || break
      sleep 1
    done
    if [ -d "/proc/$pid" ]; then
      say "dockerd $pid still running after 30 s: killing it"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 1
    fi
  fi
  # Its networks are gone: so is their store (see the docker0 note above).
  rm -f "$DIR/data/network/files/local-kv.db"
  # Anything started for this daemon names its exec root (containerd, shims): end those by pid.
  local p
  for p in /proc/[0-9]*; do
    [ -r "$p/cmdline" ] || continue
    if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qE -- "($RUN/exec/|$DIR/data/)"; then
      say "ending leftover process ${p#/proc/}: $(tr '\0' ' ' <"$p/cmdline" | cut -c1-100)"
      kill -KILL "${p#/proc/}" 2>/dev/null || true
    fi
  done
  # Mounts under our roots (overlay layers, network namespaces), deepest first.
  local m
  { findmnt -rn -o TARGET | grep -E "^($DIR|$RUN)(/|\$)" || true; } | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || say "cannot unmount $m"
  done
  # Bridges the daemon made for its networks carry addresses from our range.
  local dev
  for dev in $(ip -4 -o addr show | awk -v p="$prefix." 'index($4, p) == 1 {print $2}' | sort -u); do
    [ "$dev" = "$BRIDGE" ] && continue
    ip link delete "$dev" type bridge 2>/dev/null || true
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE" type bridge
  remove_tagged iptables FORWARD "$TAG"
  rm -f "$SOCKET" "$PIDFILE"
  say "stopped"
}

purge() {
  stop
  rm -rf "$DIR" "$RUN"
  say "purged $DIR and $RUN"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  purge) purge ;;
  status) answers && echo "$HOST" ;;
  *) die "usage: $0 start [IMAGE...] | stop | purge | status" ;;
esac
