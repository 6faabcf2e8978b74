# compactor in a container: `docker build -t compactor .`, then
# `docker run -p 8080:8080 -e OPENAI_API_KEY compactor` (the shipped proxy.yaml, listening on
# 0.0.0.0:8080 here). deploy/docker-compose.yaml runs it with the mock upstream to try it out.

# Build stage: the release binaries (compactor, and mock-upstream for the try-out compose file).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bins \
 && strip target/release/compactor target/release/mock-upstream

# Final stage: a slim Debian with the two binaries and the shipped config, run as a non-root
# user. TLS roots are compiled in; ca-certificates is there for tls.native_roots.
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin compactor
COPY --from=build /src/target/release/compactor /usr/local/bin/compactor
COPY --from=build /src/target/release/mock-upstream /usr/local/bin/mock-upstream
COPY proxy.yaml /etc/compactor/proxy.yaml
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
