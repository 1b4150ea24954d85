# syntax=docker/dockerfile:1
# The loadaware sidecar image: slim, non-root, no compilers at run time.
#   docker build -t loadaware-sidecar:0.1.0 .
#   docker run --rm loadaware-sidecar:0.1.0 config      # effective configuration (flags > env > defaults)
# Configure it with LOADAWARE_* environment variables (docs/configuration.md lists them; k8s/base/deployment.yaml
# sets them).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: a virtual environment with the package and its dependencies ----
FROM ${PYTHON_IMAGE} AS build
# Only used if some dependency has no wheel for this platform; none of it reaches the runtime stage.
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/loadaware
WORKDIR /src
# Dependencies first (a layer that survives source edits), then the package itself.
COPY pyproject.toml README.md ./
COPY loadaware ./loadaware
RUN /opt/loadaware/bin/pip install --upgrade pip setuptools \
    && /opt/loadaware/bin/pip install /src \
    && /opt/loadaware/bin/loadaware-sidecar config > /dev/null

# ---- runtime: the interpreter from the same base image and the finished venv, nothing else ----
FROM ${PYTHON_IMAGE} AS runtime
ENV PATH=/opt/loadaware/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    LOADAWARE_LISTEN=0.0.0.0:9002 \
    LOADAWARE_METRICS_LISTEN=0.0.0.0:9102
RUN groupadd --system --gid 10001 loadaware \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin loadaware
COPY --from=build /opt/loadaware /opt/loadaware
# Numeric, so Kubernetes' runAsNonRoot can verify it without resolving names.
USER 10001:10001
# 9002: gRPC (Envoy ext_proc, grpc.health.v1); 9102: /metrics. The debug API (loadaware.v1.Router, reflection)
# and /debug stay on the container's loopback (127.0.0.1:9004, :9005): kubectl port-forward, never exposed.
EXPOSE 9002 9102
ENTRYPOINT ["loadaware-sidecar"]
CMD ["serve"]
