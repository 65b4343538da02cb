# One image for both PPRE services (Tester and Test-Client) and the operator CLI.
#
#   docker build -t ppre .
#   docker run --rm ppre                       # ppre --help
#   docker compose up -d --build               # see docker-compose.yml, docs/deployment.md
#   docker compose --profile dask up -d        # + a Dask scheduler and workers from this image
#                                              #   (`dask` comes with the dependencies;
#                                              #   docs/dask.md)
#
# The project is installed with pip from pyproject.toml into a virtual environment at
# /opt/ppre; the generated gRPC stubs (proto/*_pb2*.py) are committed, so no
# protoc/grpcio-tools is needed at build time.
#
# Build arguments (all optional; the defaults are what users with network access want).
# docker-compose.yml passes each from a variable (PPRE_BASE_IMAGE, PPRE_WHEELS,
# PPRE_INDEX_URL); docs/deployment.md, "Building offline", says when to set which.
#   BASE_IMAGE  the base image. Anything Debian-based works: where it has no python3
#               (a bare Debian image), Debian's python3 is installed with apt.
#               scripts/offline-build makes one without any registry (debootstrap).
#   WHEELS      a folder in the build context holding wheels of ppre and all of its
#               dependencies (scripts/offline-build, or `pip wheel --wheel-dir
#               build/wheels .`): they are installed without a package index, for
#               builds that cannot reach one.
#   INDEX_URL   a package index to install from instead of PyPI (a local mirror).
#   EXTRAS      the project's extras to install (default ifma: the AVX-512 IFMA backend of
#               the batch primitives, Intel's crypto_mb and compiler runtime; see the
#               README's "Licences" for theirs; EXTRAS= leaves them out, and the services
#               then run the portable backend).
#   e.g. docker build --build-arg BASE_IMAGE=ppre-base:bookworm --build-arg WHEELS=build/wheels .
ARG BASE_IMAGE=python:3.11-slim

# ---- runtime: Python, the unprivileged user, an empty venv --------------------------
FROM ${BASE_IMAGE} AS runtime

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/ppre/bin:$PATH

RUN if ! command -v python3 >/dev/null 2>&1; then \
        apt-get update \
     && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
     && rm -rf /var/lib/apt/lists/*; \
    fi \
 && python3 -m venv /opt/ppre

# Unprivileged runtime user; data is mounted read-only under /data. /certs is where the
# compose file's one-shot `ppre certs init /certs` writes the TLS certificates, and
# /var/lib/ppre the Tester's privacy ledger and audit log, /var/lib/ppre-keys the audit
# log's key (outside the log's directory), /var/lib/ppre-results the Test-Client's
# results: owned by ppre, so a fresh named volume mounted there is too.
RUN groupadd --system --gid 10001 ppre \
 && useradd --system --uid 10001 --gid ppre --home-dir /home/ppre --create-home --shell /usr/sbin/nologin ppre \
 && mkdir -p /data /certs /var/lib/ppre /var/lib/ppre-keys /var/lib/ppre-results \
 && chown ppre:ppre /data /certs /var/lib/ppre /var/lib/ppre-keys /var/lib/ppre-results

# ---- build: install ppre into the venv (sources and wheels stay in this stage) ------
FROM runtime AS build
ARG WHEELS=
ARG INDEX_URL=
ARG EXTRAS=ifma
WORKDIR /src
# The context is the repository less what .dockerignore leaves out (tests, data, venvs).
# Installing from source, this stage gets a C compiler for the IFMA kernel (setup.py; it
# is optional: without one the install goes on and the fixed-base products and the
# aggregation stay on gmpy2); wheels (WHEELS) carry the kernel already built. This stage
# is not the image.
COPY . .
RUN if [ -n "$WHEELS" ]; then \
        pip install --no-index --find-links "/src/$WHEELS" "ppre${EXTRAS:+[$EXTRAS]}"; \
    else \
        if ! command -v gcc >/dev/null 2>&1; then \
            apt-get update \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends gcc libc6-dev || true; \
        fi; \
        pip install ${INDEX_URL:+--index-url "$INDEX_URL"} ".${EXTRAS:+[$EXTRAS]}"; \
    fi

# ---- the image ----------------------------------------------------------------------
FROM runtime
COPY --from=build /opt/ppre /opt/ppre

USER ppre
WORKDIR /home/ppre

# 50051: Tester (RunAudit, operator-facing); 50052: Test-Client (peer protocol).
EXPOSE 50051 50052
# In a container a service listens on the container's interface (outside one, `--host`
# defaults to 127.0.0.1): what reaches it is what `docker run -p` / compose's `ports:`
# publish on the host (docs/deployment.md).
ENV PPRE_TESTER_HOST=0.0.0.0 PPRE_CLIENT_HOST=0.0.0.0

CMD ["ppre", "--help"]
