# One image for both PPRE services (Tester and Test-Client) and the operator CLI.
#
#   docker build -t ppre .
#   docker run --rm ppre                       # ppre --help
#   docker compose up -d                       # see docker-compose.yml
#
# The project is installed with pip from pyproject.toml; the generated gRPC stubs
# (proto/*_pb2*.py) are committed, so no protoc/grpcio-tools is needed at build time.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Unprivileged runtime user; data is mounted read-only under /data.
RUN groupadd --system --gid 10001 ppre \
 && useradd --system --uid 10001 --gid ppre --home-dir /home/ppre --create-home --shell /usr/sbin/nologin ppre \
 && mkdir -p /data \
 && chown ppre:ppre /data

WORKDIR /src
# README.m[d]: copied when present (pyproject names it as the long description).
COPY pyproject.toml README.m[d] ./
COPY ppre ./ppre
COPY common ./common
COPY tester_service ./tester_service
COPY client_service ./client_service
COPY proto ./proto
RUN pip install . \
 && rm -rf /src/build /src/*.egg-info

USER ppre
WORKDIR /home/ppre

# 50051: Tester (RunAudit, operator-facing); 50052: Test-Client (peer protocol).
EXPOSE 50051 50052

CMD ["ppre", "--help"]
