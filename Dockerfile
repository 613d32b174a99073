# Lethe's image: built with the locked dependencies, run as a non-root user from a distroless
# base (no shell, no package manager). The binary carries Mozilla's CA roots (webpki-roots);
# `data_plane.upstream_ca` adds a private CA from a mounted file.
#   docker build -t lethe:0.1.0 .
# Not built in this repository's CI (the machine has no container daemon): see docs/operations.md.
FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p lethe --bin lethe \
 && strip target/release/lethe

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/lethe /usr/local/bin/lethe
COPY config/lethe.toml /etc/lethe/lethe.toml
ENV LETHE_CONFIG=/etc/lethe/lethe.toml
USER 65532:65532
# Data plane, control plane (console, API), admin (probes, metrics).
EXPOSE 7400 7401 7402
ENTRYPOINT ["/usr/local/bin/lethe"]
CMD ["serve"]
LABEL org.opencontainers.image.title="lethe" \
      org.opencontainers.image.description="A sidecar gateway that makes an AI agent's memory governable: consent, retention, erasure, audit." \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
