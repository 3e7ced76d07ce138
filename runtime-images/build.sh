#!/usr/bin/env bash
# Build the runtime images listed in runtime-images/registry.yaml.
#
#   runtime-images/build.sh                    build every image that is missing or stale
#   runtime-images/build.sh --only NAME ...    only these (NAME = busybox | shell | python, a language or an image tag)
#   runtime-images/build.sh --list             show the registry and each image's state
#   runtime-images/build.sh --force            rebuild even when up to date
#   runtime-images/build.sh --verbose          show docker build output as it runs
#
# Idempotent: each image carries the label org.aegis.runtime.inputs, a hash of its directory
# (Dockerfile included), of conventions.sh and of the ids of the bases it starts FROM; an image
# whose tag exists with the same hash is skipped. Missing bases that cannot be pulled are built
# offline by scripts/offline-bases.sh (e.g. debian:bookworm-slim from debootstrap). The busybox
# image gets its static binary from Debian's busybox-static package, installed here if missing.
set -euo pipefail

RI_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
RI_ROOT="$(cd "$RI_DIR/.." && pwd)"
RI_REGISTRY="$RI_DIR/registry.yaml"
RI_OFFLINE_BASES="$RI_ROOT/scripts/offline-bases.sh"
RI_LABEL="org.aegis.runtime.inputs"
# Files of runtime-images/ itself that the Dockerfiles COPY (the build context of every image is
# runtime-images/, so that each can reach them): part of every image's inputs hash.
RI_SHARED_FILES=(conventions.sh)
# The labels that state the conventions every image keeps (checked by verify_image), set here
# once rather than in each Dockerfile.
RI_CONVENTION_LABELS=(--label org.aegis.sandbox.user=65534:65534 --label org.aegis.sandbox.workspace=/workspace)
RI_FORCE=0
RI_VERBOSE=0

# Progress lines, one per step, prefixed so they stand out in CI logs.
log() { printf '[runtime-images] %s\n' "$*" >&2; }

# Fatal errors name the cause and the fix.
die() { printf '[runtime-images] ERROR: %s\n' "$*" >&2; exit 1; }

# The usage text is the header comment of this file.
usage() { sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

# A build without a Docker engine cannot do anything useful: stop at once and say why.
require_docker() {
  command -v docker >/dev/null 2>&1 || die "the docker CLI is not installed"
  if ! timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    die "the Docker engine does not answer (is dockerd running, and may $(id -un) use /var/run/docker.sock?)"
  fi
}

# registry.yaml -> one "name|language|version|image|dockerfile" line per runtime. The file is
# kept flat (see its header), so awk is enough and no YAML tool is needed on the host.
read_registry() {
  [ -r "$RI_REGISTRY" ] || die "cannot read $RI_REGISTRY"
  awk '
    function val(line) {
      sub(/^[^:]*:[ \t]*/, "", line); sub(/[ \t]+#.*$/, "", line)
      gsub(/^["\x27]|["\x27]$/, "", line); return line
    }
    function flush() {
      if (image != "") {
        name = dockerfile; sub(/\/[^\/]*$/, "", name); sub(/^.*\//, "", name)
        print name "|" language "|" version "|" image "|" dockerfile
      }
      language = version = image = dockerfile = ""
    }
    /^runtimes:/ { inlist = 1; next }
    /^[^ \t#-]/  { if (inlist) flush(); inlist = 0; next }
    !inlist      { next }
    /^[ \t]*- /  { flush(); sub(/- /, "  ") }
    /^[ \t]*language:/   { language = val($0) }
    /^[ \t]*version:/    { version = val($0) }
    /^[ \t]*image:/      { image = val($0) }
    /^[ \t]*dockerfile:/ { dockerfile = val($0) }
    END { flush() }
  ' "$RI_REGISTRY"
}

# The external images a Dockerfile starts FROM (stage aliases and scratch left out).
dockerfile_bases() {
  awk '
    toupper($1) == "FROM" {
      i = 2; while ($i ~ /^--/) i++
      img = $i; alias = ""
      if (toupper($(i+1)) == "AS") alias = tolower($(i+2))
      if (img != "scratch" && !(tolower(img) in stages)) print img
      if (alias != "") stages[alias] = 1
    }' "$1"
}

# Debian's busybox-static is the source of the test image's only binary.
host_busybox() {
  local bb
  for bb in /bin/busybox /usr/bin/busybox; do
    if [ -x "$bb" ] && file_is_static "$bb"; then printf '%s\n' "$bb"; return 0; fi
  done
  [ "$(id -u)" = 0 ] || die "a static busybox is needed: apt-get install busybox-static (as root)"
  log "installing Debian's busybox-static on the host"
  { apt-get install -y -q busybox-static >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q busybox-static >/dev/null; }; } \
    || die "could not install busybox-static (apt-get install busybox-static)"
  for bb in /bin/busybox /usr/bin/busybox; do
    if [ -x "$bb" ] && file_is_static "$bb"; then printf '%s\n' "$bb"; return 0; fi
  done
  die "busybox-static is installed but no static /bin/busybox was found"
}

# A dynamically linked busybox (Debian's "busybox" package) would not run FROM scratch.
file_is_static() {
  local out
  out="$(LC_ALL=C ldd "$1" 2>&1 || true)"   # ldd exits 1 on a static binary
  grep -qE 'not a dynamic executable|statically linked' <<<"$out"
}

# Per-image preparation of the build context, before it is hashed.
prepare_context() {
  local name="$1" ctx="$2"
  case "$name" in
    busybox)
      local bb
      bb="$(host_busybox)"
      if ! cmp -s "$bb" "$ctx/busybox"; then
        log "busybox: copying $bb ($("$bb" 2>&1 | head -n1 | awk '{print $2}')) into the build context"
        cp -f "$bb" "$ctx/busybox.tmp.$$"
        chmod 0755 "$ctx/busybox.tmp.$$"
        mv -f "$ctx/busybox.tmp.$$" "$ctx/busybox"
      fi
      ;;
  esac
}

# Hash of everything that decides the image: every file of the image's directory and the shared
# files it may COPY (path, mode, content), and the ids of the base images.
inputs_hash() {
  local ctx="$1" dockerfile="$2" base id
  {
    (cd "$ctx" && find . -type f -print0 | LC_ALL=C sort -z \
      | xargs -0 -r sha256sum \
      && find . \( -type f -o -type l -o -type d \) -printf '%p %m %l\n' | LC_ALL=C sort)
    (cd "$RI_DIR" && sha256sum "${RI_SHARED_FILES[@]}" && stat -c '%n %a' "${RI_SHARED_FILES[@]}")
    while read -r base; do
      [ -n "$base" ] || continue
      id="$(docker image inspect -f '{{.Id}}' "$base" 2>/dev/null || echo missing)"
      printf 'base %s %s\n' "$base" "$id"
    done < <(dockerfile_bases "$dockerfile")
  } | sha256sum | cut -c1-64
}

# The hash recorded on an existing image, or nothing.
image_hash() {
  docker image inspect -f "{{ index .Config.Labels \"$RI_LABEL\" }}" "$1" 2>/dev/null || true
}

# Make each FROM image available (present, pulled, or built offline), once per run.
ensure_bases() {
  local dockerfile="$1" base
  while read -r base; do
    [ -n "$base" ] || continue
    case " ${RI_BASES_DONE:-} " in *" $base "*) continue ;; esac
    "$RI_OFFLINE_BASES" ensure "$base" || die "base image $base is not available (see above)"
    RI_BASES_DONE="${RI_BASES_DONE:-} $base"
  done < <(dockerfile_bases "$dockerfile")
}

# The conventions every runtime image promises, checked on the image just built.
verify_image() {
  local image="$1" out
  out="$(docker run --rm --network none --user 0 --entrypoint /bin/sh "$image" -c \
    'owner=$(ls -nd /workspace | awk "{print \$3\":\"\$4}"); \
     u=$(grep -c "^[^:]*:[^:]*:65534:" /etc/passwd); g=$(grep -c "^[^:]*:[^:]*:65534:" /etc/group); \
     echo "$owner $u $g"' 2>&1)" || die "$image: could not run /bin/sh in the new image: $out"
  [ "$out" = "65534:65534 1 1" ] \
    || die "$image: expected /workspace owned by 65534:65534 and uid/gid 65534 defined once, got '$out'"
}

# Build one registry entry unless its tag exists with the same inputs hash.
build_one() {
  local name="$1" image="$2" dockerfile_rel="$3"
  local dockerfile="$RI_DIR/$dockerfile_rel" ctx hash current start logfile old_id build
  [ -r "$dockerfile" ] || die "$name: $dockerfile (from registry.yaml) does not exist"
  ctx="$(dirname "$dockerfile")"
  ensure_bases "$dockerfile"
  prepare_context "$name" "$ctx"
  hash="$(inputs_hash "$ctx" "$dockerfile")"
  current="$(image_hash "$image")"
  if [ "$current" = "$hash" ] && [ "$RI_FORCE" != 1 ]; then
    log "$image is up to date (inputs ${hash:0:12})"
    return 0
  fi
  if [ "$RI_FORCE" = 1 ] && [ "$current" = "$hash" ]; then
    log "$image: rebuilding (--force)"
  elif [ -n "$current" ]; then
    log "$image: rebuilding (inputs changed: ${current:0:12} -> ${hash:0:12})"
  elif docker image inspect "$image" >/dev/null 2>&1; then
    log "$image: rebuilding (present, but not built by build.sh: no $RI_LABEL label)"
  else
    log "$image: building (not present)"
  fi
  start=$SECONDS
  old_id="$(docker image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
  logfile="$(mktemp /tmp/runtime-images-build.XXXXXX.log)"
  build=(docker build --label "$RI_LABEL=$hash" "${RI_CONVENTION_LABELS[@]}" -t "$image" -f "$dockerfile" "$RI_DIR")
  if [ "$RI_VERBOSE" = 1 ]; then
    "${build[@]}" 2>&1 | tee "$logfile" >&2 \
      || { rm -f "$logfile"; die "$image: docker build failed (output above)"; }
  elif ! "${build[@]}" >"$logfile" 2>&1; then
    tail -n 30 "$logfile" >&2
    die "$image: docker build failed (last lines above; full log $logfile)"
  fi
  rm -f "$logfile"
  verify_image "$image"
  # The image this tag pointed to before is garbage now, unless a container still uses it.
  if [ -n "$old_id" ] && [ "$old_id" != "$(docker image inspect -f '{{.Id}}' "$image")" ]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true
  fi
  log "$image: built in $((SECONDS - start)) s ($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%.1f MB", $1/1e6}'))"
}

# --list: the registry, and the state of each image when Docker answers.
list_registry() {
  local docker_ok=0 name language version image dockerfile state hash
  timeout 10 docker version >/dev/null 2>&1 && docker_ok=1
  printf '%-8s %-10s %-10s %-30s %s\n' NAME LANGUAGE VERSION IMAGE STATE
  while IFS='|' read -r name language version image dockerfile; do
    state="?"
    if [ "$docker_ok" = 1 ]; then
      hash="$(image_hash "$image")"
      if [ -z "$hash" ] && ! docker image inspect "$image" >/dev/null 2>&1; then state="missing"
      elif [ -z "$hash" ]; then state="present (not built by build.sh)"
      else state="built (inputs ${hash:0:12})"
      fi
    fi
    printf '%-8s %-10s %-10s %-30s %s\n' "$name" "$language" "$version" "$image" "$state"
  done < <(read_registry)
}

# Serialise concurrent runs: they would race on the same tags and the same busybox copy.
take_lock() {
  local dir="${RUNTIME_IMAGES_LOCK_DIR:-/var/lock}"
  [ -w "$dir" ] || dir="${TMPDIR:-/tmp}"
  exec 8>"$dir/aegis-runtime-images.lock"
  if ! flock -n 8; then
    log "waiting for another build.sh to finish ($dir/aegis-runtime-images.lock)"
    flock 8
  fi
}

main() {
  local only=() list=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --only) [ $# -ge 2 ] || die "--only needs a NAME"; only+=("$2"); shift 2 ;;
      --only=*) only+=("${1#--only=}"); shift ;;
      --list) list=1; shift ;;
      --force) RI_FORCE=1; shift ;;
      --verbose|-v) RI_VERBOSE=1; shift ;;
      -h|--help) usage; return 0 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
  [ -x "$RI_OFFLINE_BASES" ] || die "missing $RI_OFFLINE_BASES"
  if [ "$list" = 1 ]; then list_registry; return 0; fi

  local entries=() name language version image dockerfile want found
  mapfile -t entries < <(read_registry)
  [ "${#entries[@]}" -gt 0 ] || die "no runtimes found in $RI_REGISTRY"
  for want in "${only[@]}"; do
    found=0
    for e in "${entries[@]}"; do
      IFS='|' read -r name language version image dockerfile <<<"$e"
      if [ "$want" = "$name" ] || [ "$want" = "$image" ] || [ "$want" = "$language" ]; then found=1; fi
    done
    [ "$found" = 1 ] || die "--only $want: no such runtime (names: $(printf '%s\n' "${entries[@]}" | cut -d'|' -f1 | sort -u | tr '\n' ' '))"
  done

  require_docker
  take_lock
  local start=$SECONDS count=0 done_images=" "
  for e in "${entries[@]}"; do
    IFS='|' read -r name language version image dockerfile <<<"$e"
    # Several language/version pairs may share one image (aliases): build it once.
    case "$done_images" in *" $image "*) continue ;; esac
    if [ "${#only[@]}" -gt 0 ]; then
      found=0
      for want in "${only[@]}"; do
        if [ "$want" = "$name" ] || [ "$want" = "$image" ] || [ "$want" = "$language" ]; then found=1; fi
      done
      [ "$found" = 1 ] || continue
    fi
    build_one "$name" "$image" "$dockerfile"
    done_images="$done_images$image "
    count=$((count + 1))
  done
  log "done: $count image(s) ready in $((SECONDS - start)) s"
}

main "$@"
