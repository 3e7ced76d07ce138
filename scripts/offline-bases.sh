#!/usr/bin/env bash
# Provide the base images our Dockerfiles start FROM on a machine that cannot pull from any
# container registry. Each base is made locally, from Debian's packages (debootstrap) and,
# for Rust, from this machine's own rustup toolchain, and tagged under the official name, so
# the Dockerfiles stay unchanged for users who can pull.
#
#   scripts/offline-bases.sh all                 every base below that is missing
#   scripts/offline-bases.sh debian              debian:bookworm-slim  (debootstrap + docker import)
#                                                (OFFLINE_BASES_SUITE=trixie: debian:trixie-slim)
#   scripts/offline-bases.sh postgres            postgres:15-bookworm  (scripts/offline/postgres/)
#   scripts/offline-bases.sh rust                rust:1.95-bookworm    (scripts/offline/rust/ + host toolchain)
#   scripts/offline-bases.sh ensure IMAGE...     present? else pull? else build offline if we know how
#   scripts/offline-bases.sh list                the bases this script knows
#
# Every subcommand is a no-op for a tag that already exists (--force / OFFLINE_BASES_FORCE=1
# rebuilds). A pull is tried first, with a short timeout (OFFLINE_BASES_PULL=0 skips it).
# The debootstrapped root filesystem is cached as a tarball under /var/cache/aegis-offline-bases
# (OFFLINE_BASES_CACHE), so a re-import takes seconds. A lock (flock) serialises concurrent runs.
# The file can also be sourced: it then only defines the functions.
set -euo pipefail

OB_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OB_SUITE="${OFFLINE_BASES_SUITE:-bookworm}"
OB_DEBIAN_TAG="debian:${OB_SUITE}-slim"
OB_POSTGRES_TAG="postgres:15-${OB_SUITE}"
OB_RUST_MINOR="1.95"
OB_RUST_TAG="rust:${OB_RUST_MINOR}-${OB_SUITE}"
OB_PULL_TIMEOUT="${OFFLINE_BASES_PULL_TIMEOUT:-30}"
OB_FORCE="${OFFLINE_BASES_FORCE:-0}"

# Progress lines go to stderr so that callers can capture stdout.
ob_log() { printf '[offline-bases] %s\n' "$*" >&2; }

# Fatal errors say what failed and what to do about it.
ob_die() { printf '[offline-bases] ERROR: %s\n' "$*" >&2; exit 1; }

# Everything below needs a Docker engine; say so plainly when there is none.
ob_require_docker() {
  command -v docker >/dev/null 2>&1 || ob_die "the docker CLI is not installed"
  if ! timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    ob_die "the Docker engine does not answer (is dockerd running, and may $(id -un) use /var/run/docker.sock?)"
  fi
}

# The cache must survive across runs but stay out of the repository.
ob_cache_dir() {
  local dir="${OFFLINE_BASES_CACHE:-/var/cache/aegis-offline-bases}"
  if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
    dir="${XDG_CACHE_HOME:-$HOME/.cache}/aegis-offline-bases"
    mkdir -p "$dir"
  fi
  printf '%s\n' "$dir"
}

# One writer at a time: concurrent runs wait instead of debootstrapping twice.
ob_lock() {
  [ "${OB_LOCKED:-0}" = 1 ] && return 0
  local cache
  cache="$(ob_cache_dir)"
  exec 9>"$cache/lock"
  if ! flock -n 9; then
    ob_log "waiting for another run to release $cache/lock"
    flock 9
  fi
  OB_LOCKED=1
}

# True when the engine already has this tag.
ob_have_image() { docker image inspect "$1" >/dev/null 2>&1; }

# A machine that can pull should get the real image; here the pull fails fast (no registry).
ob_try_pull() {
  local image="$1"
  [ "${OFFLINE_BASES_PULL:-1}" = 0 ] && return 1
  ob_log "trying: docker pull $image (timeout ${OB_PULL_TIMEOUT}s)"
  if timeout "$OB_PULL_TIMEOUT" docker pull -q "$image" >/dev/null 2>&1; then
    ob_log "pulled $image"
    return 0
  fi
  ob_log "cannot pull $image; building it offline"
  return 1
}

# Common front half of every base: done already, or pulled, or else the caller builds it.
ob_needs_build() {
  local image="$1"
  if ob_have_image "$image" && [ "$OB_FORCE" != 1 ]; then
    ob_log "$image is present"
    return 1
  fi
  if [ "$OB_FORCE" != 1 ] && ob_try_pull "$image"; then
    return 1
  fi
  return 0
}

# The Debian mirror this host's apt already uses (deb822 .sources or one-line .list), so the
# base is built from a mirror known to be reachable. DEBIAN_MIRROR overrides; $1 = suite.
ob_host_mirror() {
  local suite="$1" want="${2:-main}" f uri=""
  if [ -n "${DEBIAN_MIRROR:-}" ] && [ "$want" = main ]; then
    printf '%s\n' "$DEBIAN_MIRROR"; return 0
  fi
  if [ -n "${DEBIAN_SECURITY_MIRROR:-}" ] && [ "$want" = security ]; then
    printf '%s\n' "$DEBIAN_SECURITY_MIRROR"; return 0
  fi
  local target="$suite"
  [ "$want" = security ] && target="$suite-security"
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -r "$f" ] || continue
    # deb822 stanzas are separated by blank lines; pick the first with Types: deb and our suite.
    uri="$(awk -v suite="$target" '
      BEGIN { RS=""; FS="\n" }
      {
        types=""; uris=""; suites=""; enabled="yes"
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^Types:/)   { types=$i }
          if ($i ~ /^URIs:/)    { uris=$i;   sub(/^URIs:[ \t]*/, "", uris) }
          if ($i ~ /^Suites:/)  { suites=" " $i " " }
          if ($i ~ /^Enabled:[ \t]*no/) { enabled="no" }
        }
        if (enabled == "yes" && types ~ /[ \t]deb([ \t]|$)/ && suites ~ ("[ \t]" suite "[ \t]")) {
          split(uris, u, /[ \t]+/); print u[1]; exit
        }
      }' "$f")"
    [ -n "$uri" ] && break
  done
  if [ -z "$uri" ]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
      [ -r "$f" ] || continue
      uri="$(awk -v suite="$target" '
        $1 == "deb" {
          i = 2
          if ($i ~ /^\[/) { while ($i !~ /\]$/) i++; i++ }
          if ($(i+1) == suite) { print $i; exit }
        }' "$f")"
      [ -n "$uri" ] && break
    done
  fi
  if [ -z "$uri" ]; then
    if [ "$want" = security ]; then uri="http://deb.debian.org/debian-security"; else uri="http://deb.debian.org/debian"; fi
  fi
  printf '%s\n' "${uri%/}"
}

# Turn a fresh debootstrap tree into something close to the official -slim image: no docs,
# no apt caches, apt sources for the suite + updates + security, nothing host-specific left.
ob_slim_rootfs() {
  local dir="$1" suite="$2" mirror="$3" security="$4"
  # Guard the rm -rf below: this must be a freshly bootstrapped tree, never / or empty.
  if [ -z "$dir" ] || [ "$dir" = / ] || [ ! -x "$dir/usr/bin/apt-get" ]; then
    ob_die "refusing to slim '$dir': not a debootstrap tree"
  fi
  rm -f "$dir/etc/apt/sources.list"
  mkdir -p "$dir/etc/apt/sources.list.d"
  cat >"$dir/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $security
Suites: $suite-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  mkdir -p "$dir/etc/dpkg/dpkg.cfg.d" "$dir/etc/apt/apt.conf.d"
  # Keep packages installed later small, as in the official slim images.
  cat >"$dir/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# offline base: do not install documentation, manual pages or translations
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
EOF
  cat >"$dir/etc/apt/apt.conf.d/docker-clean" <<'EOF'
// offline base: drop downloaded .deb files and binary caches after every run of apt
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
  cat >"$dir/etc/apt/apt.conf.d/docker-no-languages" <<'EOF'
// offline base: no translated package descriptions
Acquire::Languages "none";
EOF
  cat >"$dir/etc/apt/apt.conf.d/docker-autoremove-suggests" <<'EOF'
// offline base: suggested packages are not kept alive by autoremove
Apt::AutoRemove::SuggestsImportant "false";
EOF
  find "$dir/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
  find "$dir/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
  rm -rf "$dir/usr/share/man/"* "$dir/usr/share/info/"* "$dir/usr/share/locale/"*
  rm -rf "$dir/var/lib/apt/lists/"* "$dir/var/cache/apt/"*.bin "$dir/var/cache/apt/archives/"*.deb
  rm -rf "$dir/var/log/"*.log "$dir/var/log/apt/"* "$dir/tmp/"* "$dir/var/tmp/"*
  rm -rf "${dir:?}/dev/"* "${dir:?}/proc/"* "${dir:?}/sys/"* "${dir:?}/run/"*
  # Docker provides these per container; the host's values must not be baked in.
  : >"$dir/etc/resolv.conf"
  : >"$dir/etc/hostname"
  [ -e "$dir/etc/machine-id" ] && : >"$dir/etc/machine-id"
  true
}

# debootstrap (minbase) into a scratch directory and pack it as a tarball in the cache.
ob_debootstrap_tarball() {
  local suite="$1" tarball="$2" mirror security work
  [ "$(id -u)" = 0 ] || ob_die "debootstrap needs root; run: sudo $0 debian"
  if ! command -v debootstrap >/dev/null 2>&1; then
    ob_log "installing debootstrap from Debian's packages"
    apt-get install -y -q debootstrap >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null && apt-get install -y -q debootstrap >/dev/null; } \
      || ob_die "debootstrap is missing and could not be installed (apt-get install debootstrap)"
  fi
  mirror="$(ob_host_mirror "$suite" main)"
  security="$(ob_host_mirror "$suite" security)"
  work="$(mktemp -d /var/tmp/offline-bases.XXXXXX)"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory
  trap "ob_cleanup_work '$work'; rm -f '$tarball.tmp.$$'" EXIT
  ob_log "debootstrap --variant=minbase $suite from $mirror (about 40 s)"
  if ! debootstrap --variant=minbase --arch="$(ob_arch)" "$suite" "$work/rootfs" "$mirror" >"$work/debootstrap.log" 2>&1; then
    tail -n 20 "$work/debootstrap.log" >&2 || true
    ob_die "debootstrap failed (full log above, mirror $mirror)"
  fi
  ob_unmount_below "$work/rootfs"
  ob_slim_rootfs "$work/rootfs" "$suite" "$mirror" "$security"
  tar --numeric-owner --xattrs -C "$work/rootfs" -cf "$tarball.tmp.$$" .
  mv -f "$tarball.tmp.$$" "$tarball"
  ob_cleanup_work "$work"
  trap - EXIT
  ob_log "cached root filesystem: $tarball ($(du -h "$tarball" | cut -f1))"
}

# Debian's name for this machine's architecture (the base must match the engine's).
ob_arch() { dpkg --print-architecture 2>/dev/null || echo amd64; }

# debootstrap normally unmounts /proc and /sys itself; make sure before we tar or delete.
ob_unmount_below() {
  local dir="$1" m
  while read -r m; do
    umount -l "$m" 2>/dev/null || true
  done < <(awk -v d="$dir" '$2 ~ ("^" d "/") { print $2 }' /proc/mounts | sort -r)
}

# Remove a scratch tree even if a step failed halfway through.
ob_cleanup_work() {
  local work="$1"
  [ -d "$work" ] || return 0
  ob_unmount_below "$work"
  rm -rf --one-file-system "$work"
}

# debian:<suite>-slim, from Debian's packages when it cannot be pulled.
ob_build_debian() {
  ob_needs_build "$OB_DEBIAN_TAG" || return 0
  ob_lock
  ob_have_image "$OB_DEBIAN_TAG" && [ "$OB_FORCE" != 1 ] && { ob_log "$OB_DEBIAN_TAG is present"; return 0; }
  local cache tarball start
  start=$SECONDS
  cache="$(ob_cache_dir)"
  tarball="$cache/debian-$OB_SUITE-minbase-$(ob_arch).tar"
  if [ ! -s "$tarball" ] || [ "${OFFLINE_BASES_REFRESH:-0}" = 1 ]; then
    ob_debootstrap_tarball "$OB_SUITE" "$tarball"
  else
    ob_log "using cached root filesystem $tarball (OFFLINE_BASES_REFRESH=1 rebuilds it)"
  fi
  docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["bash"]' \
    --message "offline base: debootstrap --variant=minbase $OB_SUITE" \
    "$tarball" "$OB_DEBIAN_TAG" >/dev/null
  ob_log "built $OB_DEBIAN_TAG in $((SECONDS - start)) s"
}

# postgres:15-<suite>: Debian's postgresql-15 behind an entrypoint honouring the official contract.
ob_build_postgres() {
  ob_needs_build "$OB_POSTGRES_TAG" || return 0
  OB_FORCE=0 ob_build_debian
  ob_lock
  local start=$SECONDS
  ob_log "building $OB_POSTGRES_TAG from scripts/offline/postgres (apt-get install postgresql-15)"
  docker build -q --label "org.aegis.offline-base=postgres" \
    -t "$OB_POSTGRES_TAG" "$OB_ROOT/scripts/offline/postgres" >/dev/null \
    || ob_die "docker build of $OB_POSTGRES_TAG failed (run it without -q to see why: docker build $OB_ROOT/scripts/offline/postgres)"
  ob_log "built $OB_POSTGRES_TAG in $((SECONDS - start)) s"
}

# The host's stable toolchain directory; it must be the Rust minor version the tag promises.
ob_host_toolchain() {
  local rustup_home="${RUSTUP_HOME:-$HOME/.rustup}" dir version
  for dir in "$rustup_home/toolchains/$OB_RUST_MINOR".*-x86_64-unknown-linux-gnu \
             "$rustup_home/toolchains/stable-x86_64-unknown-linux-gnu" \
             "$rustup_home/toolchains/$OB_RUST_MINOR-x86_64-unknown-linux-gnu"; do
    if [ ! -x "$dir/bin/rustc" ] || [ ! -x "$dir/bin/cargo" ]; then continue; fi
    version="$("$dir/bin/rustc" --version | awk '{print $2}')"
    case "$version" in
      "$OB_RUST_MINOR".*) readlink -f "$dir"; return 0 ;;
    esac
  done
  return 1
}

# rust:1.95-<suite>: Debian's C toolchain + the host's rustup toolchain laid out like the official image.
ob_build_rust() {
  ob_needs_build "$OB_RUST_TAG" || return 0
  OB_FORCE=0 ob_build_debian
  ob_lock
  local toolchain version rustup_bin start=$SECONDS
  toolchain="$(ob_host_toolchain)" \
    || ob_die "no Rust $OB_RUST_MINOR.x toolchain under ${RUSTUP_HOME:-$HOME/.rustup}/toolchains (rustup toolchain install $OB_RUST_MINOR)"
  version="$("$toolchain/bin/rustc" --version | awk '{print $2}')"
  rustup_bin="$(command -v rustup || true)"
  [ -n "$rustup_bin" ] || rustup_bin="${CARGO_HOME:-$HOME/.cargo}/bin/rustup"
  [ -x "$rustup_bin" ] || ob_die "rustup not found (looked at PATH and ${CARGO_HOME:-$HOME/.cargo}/bin)"
  ob_log "building $OB_RUST_TAG with the host toolchain $version ($toolchain), docs left out"
  local stage
  stage="$(mktemp -d "$(ob_cache_dir)/rust-context.XXXXXX")"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory
  trap "rm -rf '$stage'" EXIT
  cp "$OB_ROOT/scripts/offline/rust/Dockerfile" "$stage/Dockerfile"
  cp "$rustup_bin" "$stage/rustup-bin"
  # Locally added CAs go in too: where the host's egress passes a TLS-inspecting proxy, cargo
  # in the build container must trust the same roots as the host to reach crates.io.
  mkdir -p "$stage/extra-ca"
  if [ -d /usr/local/share/ca-certificates ]; then
    cp -a /usr/local/share/ca-certificates/. "$stage/extra-ca/"
  fi
  # The build context is streamed as one tar: the small files from the stage, and the
  # toolchain under toolchain/ (without its 800 MB of HTML docs) straight from where it is.
  tar -c --owner=0 --group=0 --numeric-owner \
      -C "$stage" Dockerfile rustup-bin extra-ca \
      -C "$toolchain" --exclude=./share/doc --exclude='./lib/rustlib/manifest-rust-docs-*' \
        --transform 's,^\./,toolchain/,S' . \
    | docker build -q --build-arg "RUST_VERSION=$version" --label "org.aegis.offline-base=rust" \
        -t "$OB_RUST_TAG" - >/dev/null \
    || ob_die "docker build of $OB_RUST_TAG failed"
  rm -rf "$stage"
  trap - EXIT
  docker run --rm "$OB_RUST_TAG" cargo --version >/dev/null \
    || ob_die "$OB_RUST_TAG was built but 'cargo --version' does not run in it"
  ob_log "built $OB_RUST_TAG in $((SECONDS - start)) s ($(docker run --rm "$OB_RUST_TAG" cargo --version))"
}

# Make one image available: present, pulled, or built by a recipe above.
ob_ensure() {
  local image="$1"
  case "$image" in
    "$OB_DEBIAN_TAG") ob_build_debian ;;
    "$OB_POSTGRES_TAG") ob_build_postgres ;;
    "$OB_RUST_TAG") ob_build_rust ;;
    debian:bookworm-slim|debian:trixie-slim)
      # Another Debian suite than this run's (runtimes on trixie: node 20, go 1.24): same recipe.
      local suite="${image#debian:}"
      ( OB_SUITE="${suite%-slim}"; OB_DEBIAN_TAG="$image"; ob_build_debian )
      ;;
    scratch) return 0 ;;
    *)
      ob_have_image "$image" && { ob_log "$image is present"; return 0; }
      ob_try_pull "$image" && return 0
      ob_die "$image is not present, cannot be pulled, and this script has no offline recipe for it (known: $OB_DEBIAN_TAG $OB_POSTGRES_TAG $OB_RUST_TAG)"
      ;;
  esac
}

# Command-line entry point.
ob_main() {
  local cmd="${1:-help}"
  [ $# -gt 0 ] && shift
  local args=()
  for a in "$@"; do
    case "$a" in
      --force) OB_FORCE=1 ;;
      --no-pull) OFFLINE_BASES_PULL=0 ;;
      *) args+=("$a") ;;
    esac
  done
  case "$cmd" in
    help|-h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; return 0 ;;
    list) printf '%s\n' "$OB_DEBIAN_TAG" "$OB_POSTGRES_TAG" "$OB_RUST_TAG"; return 0 ;;
  esac
  ob_require_docker
  case "$cmd" in
    debian) ob_build_debian ;;
    postgres) ob_build_postgres ;;
    rust) ob_build_rust ;;
    all) ob_build_debian; ob_build_postgres; ob_build_rust ;;
    ensure)
      [ "${#args[@]}" -gt 0 ] || ob_die "ensure needs at least one image name"
      for a in "${args[@]}"; do ob_ensure "$a"; done
      ;;
    *) ob_die "unknown subcommand '$cmd' (try: $0 help)" ;;
  esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  ob_main "$@"
fi
