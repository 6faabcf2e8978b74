# compactor in a container: `docker build -t compactor .` (podman: `podman build --format docker
# -t compactor .`, since podman's default OCI format drops the HEALTHCHECK), then
# `docker run -p 8080:8080 -e OPENAI_API_KEY compactor` (the shipped proxy.yaml, listening on
# 0.0.0.0:8080 here). The image holds compactor alone; the mock upstream that
# deploy/docker-compose.yaml tries it out with is an image of its own (`--target mock`).
# scripts/container-check.sh builds and checks all of it.

# Build stage: the release binaries (compactor, and mock-upstream for the try-out compose file).
FROM rust:1-bookworm AS build
WORKDIR /src
# Dependencies first, from the manifests alone, with stub sources: this layer is rebuilt only when
# Cargo.toml or Cargo.lock change, so a code change recompiles compactor's own two crates only.
COPY Cargo.toml Cargo.lock ./
COPY mock-upstream/Cargo.toml mock-upstream/
RUN mkdir -p src mock-upstream/src benches \
 && echo 'fn main() {}' > src/main.rs && touch src/lib.rs \
 && echo 'fn main() {}' > mock-upstream/src/main.rs && touch mock-upstream/src/lib.rs \
 && echo 'fn main() {}' > benches/planner.rs && cp benches/planner.rs benches/sessions.rs \
 && cargo build --release --locked --workspace --bins \
 && rm -rf src mock-upstream/src benches
COPY . .
# The copied sources keep their own (older) times; touched, cargo sees them newer than the stubs.
RUN touch src/main.rs src/lib.rs mock-upstream/src/main.rs mock-upstream/src/lib.rs \
 && cargo build --release --locked --workspace --bins \
 && strip target/release/compactor target/release/mock-upstream

# The mock upstream, for the try-out compose file and the container check only: never in the
# production image (it carried a second copy of the tokenizer tables, about 47 MB).
FROM debian:bookworm-slim AS mock
COPY --from=build /src/target/release/mock-upstream /usr/local/bin/mock-upstream
USER 65534:65534
ENTRYPOINT ["mock-upstream"]

# The production image (the default target: the last stage): a slim Debian with compactor and
# the shipped config, run as a non-root user. TLS roots are compiled in; ca-certificates is
# there for tls.native_roots.
FROM debian:bookworm-slim AS compactor
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && groupadd --system --gid 10001 compactor \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin compactor
COPY --from=build /src/target/release/compactor /usr/local/bin/compactor
COPY proxy.yaml /etc/compactor/proxy.yaml
# The config is chosen here, through COMPACTOR_CONFIG, and nowhere on the command line: the
# HEALTHCHECK's `compactor health` reads the same variable, so it probes the config that runs.
# Compose files and charts that mount another config set COMPACTOR_CONFIG to it.
ENV COMPACTOR_CONFIG=/etc/compactor/proxy.yaml \
    COMPACTOR_LISTEN=0.0.0.0:8080 \
    RUST_LOG=info
USER 10001:10001
EXPOSE 8080
# `compactor health` asks /healthz on the configured port: no curl needed in the image.
HEALTHCHECK --interval=10s --timeout=4s --start-period=5s --retries=3 CMD ["compactor", "health"]
# SIGTERM drains in-flight requests and streams for shutdown_grace_secs, then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["compactor"]
CMD ["--log-format", "json"]
