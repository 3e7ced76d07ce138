# The orchestrator service image.
#   docker build -t aegis-orchestrator .          (or: docker-compose build orchestrator)
# Works with the classic builder of Docker 20.10 and with BuildKit alike (no BuildKit-only syntax).
# Where rust:1.95-bookworm and debian:bookworm-slim cannot be pulled, scripts/offline-bases.sh
# provides them under the same tags first.

# --- skeleton: the workspace manifests plus a stub for every target root -------------------
# The next stage compiles all dependencies from this skeleton alone, so that layer is reused until
# a Cargo.toml, Cargo.lock or the set of targets changes (build.rs, src/main.rs, src/lib.rs,
# src/bin/*, examples/, tests/, benches/, explicit `path = "*.rs"`), not on every code edit.
FROM debian:bookworm-slim AS skeleton
WORKDIR /src
COPY . .
# Said here, not in the build stage, so that editing the message never invalidates the cache.
RUN echo ">>> The next stage compiles the orchestrator in release mode. The first build takes \
about 10 minutes on 2 cores (less on more): first the dependencies (about 4 minutes, cached \
afterwards until Cargo.lock changes), then the orchestrator itself (about 5 minutes, every build)."
RUN set -eu; \
    stub() { mkdir -p "/skeleton/$(dirname "$1")"; \
        case "$1" in */lib.rs) : >"/skeleton/$1" ;; *) echo 'fn main() {}' >"/skeleton/$1" ;; esac; }; \
    mkdir -p /skeleton; \
    cp Cargo.lock /skeleton/Cargo.lock; \
    find . -path ./target -prune -o -name Cargo.toml -type f -print | while read -r manifest; do \
        d="$(dirname "$manifest")"; \
        mkdir -p "/skeleton/$d"; \
        cp "$manifest" "/skeleton/$manifest"; \
        for f in "$d"/build.rs "$d"/src/main.rs "$d"/src/lib.rs "$d"/src/bin/*.rs "$d"/src/bin/*/main.rs \
                 "$d"/examples/*.rs "$d"/examples/*/main.rs "$d"/tests/*.rs "$d"/tests/*/main.rs \
                 "$d"/benches/*.rs "$d"/benches/*/main.rs; do \
            if [ -f "$f" ]; then stub "$f"; fi; \
        done; \
        sed -n 's/^[[:space:]]*path[[:space:]]*=[[:space:]]*"\([^"]*\.rs\)".*/\1/p' "$manifest" \
            | while read -r p; do if [ -f "$d/$p" ]; then stub "$d/$p"; fi; done; \
    done; \
    find /skeleton -exec touch -d '2000-01-01 00:00:00' {} +

# --- build ------------------------------------------------------------------------------------
# Two binaries: the service (profile `image`: release without cross-crate LTO, see Cargo.toml),
# and the sandbox executor that the service installs into every sandbox. The executor is linked statically (it must run in FROM-scratch and musl images too)
# and gets its own target directory, so its RUSTFLAGS never invalidate the service's artefacts.
FROM rust:1.95-bookworm AS build
WORKDIR /src
ENV CARGO_TERM_COLOR=never
COPY --from=skeleton /skeleton/ ./
RUN set -eu; \
    cargo build --profile image --locked -p orchestrator; \
    host="$(rustc -vV | sed -n 's/^host: //p')"; \
    CARGO_TARGET_DIR=target/executor RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked -p sandbox-executor --target "$host"
COPY . .
# The stubs' build artefacts must look older than the real sources.
RUN set -eu; \
    find . -path ./target -prune -o -name '*.rs' -type f -exec touch {} +; \
    cargo build --profile image --locked -p orchestrator; \
    host="$(rustc -vV | sed -n 's/^host: //p')"; \
    CARGO_TARGET_DIR=target/executor RUSTFLAGS="-C target-feature=+crt-static" \
        cargo build --release --locked -p sandbox-executor --target "$host"; \
    install -D -m 0755 target/image/orchestrator /out/orchestrator; \
    install -D -m 0755 "target/executor/$host/release/sandbox-executor" /out/sandbox-executor; \
    if ldd /out/sandbox-executor >/dev/null 2>&1 && ! ldd /out/sandbox-executor 2>&1 | grep -q 'statically linked'; then \
        echo "sandbox-executor is not static" >&2; exit 1; \
    fi

# --- runtime ------------------------------------------------------------------------------------
# Runs as root on purpose: it drives the Docker engine through the mounted socket. iptables: the
# host firewall rules of networked sandboxes (docker-compose.yml runs this service in the host's
# network namespace with NET_ADMIN; Debian's default is the nf_tables backend, as on Docker hosts
# of the last years). Without it (or without NET_ADMIN) a networked sandbox is refused, never
# created unfiltered.
FROM debian:bookworm-slim
RUN set -eux; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates curl iptables; \
    rm -rf /var/lib/apt/lists/*
COPY --from=build /out/orchestrator /usr/local/bin/orchestrator
COPY --from=build /out/sandbox-executor /usr/local/libexec/orchestrator/sandbox-executor
# Where the service finds the static executor it installs into sandboxes.
ENV SANDBOX_EXECUTOR_BIN=/usr/local/libexec/orchestrator/sandbox-executor
EXPOSE 8088 50051
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8088/health/ready >/dev/null || exit 1
ENTRYPOINT ["orchestrator"]
CMD ["serve", "--http", "0.0.0.0:8088", "--grpc", "0.0.0.0:50051"]
