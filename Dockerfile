# longrank: multi-stage build. Untested here (no Docker engine on the development machines); linted with hadolint.
# Build:  docker build -t longrank .
# Run:    docker run -p 8080:8080 -v longrank-data:/data -e LONGRANK_SERVER_ADMIN_KEYS=KEY longrank
#         (it listens beyond loopback: without an admin key it serves reads only)

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
# Incremental codegen speeds up edit-and-rebuild on a workstation; a one-off image build does not need it.
ENV CARGO_INCREMENTAL=0
# Dependencies first, so that source changes do not rebuild them.
COPY Cargo.toml Cargo.lock ./
RUN mkdir -p src tests/it static \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs tests/it/main.rs static/index.html static/common.js static/search.js static/batch.js \
       static/collections.js static/app.js static/style.css \
    && cargo build --release --locked --bin longrank \
    && rm -rf src tests static
COPY src ./src
COPY static ./static
COPY migrations ./migrations
COPY tests ./tests
# Stripped: the release profile keeps line tables for profiling, which an image has no use for (266 MB to tens).
RUN touch src/main.rs src/lib.rs && cargo build --release --locked --bin longrank \
    && strip --strip-all target/release/longrank

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates=* curl=* libopenblas0-pthread=* \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --create-home --home-dir /data longrank
COPY --from=build /src/target/release/longrank /usr/local/bin/longrank
COPY config.toml /etc/longrank/config.toml
USER 10001
WORKDIR /data
# The hub cache lives in the volume too, so the default re-ranker is downloaded once.
ENV LONGRANK_CONFIG=/etc/longrank/config.toml \
    LONGRANK_DATA_DIR=/data \
    LONGRANK_SERVER_ADDR=0.0.0.0:8080 \
    HF_HOME=/data/hf
EXPOSE 8080
VOLUME ["/data"]
HEALTHCHECK --interval=30s --timeout=3s --start-period=60s CMD ["curl", "-fsS", "http://127.0.0.1:8080/health"]
ENTRYPOINT ["longrank"]
CMD ["serve"]
