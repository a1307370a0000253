# syntax=docker/dockerfile:1
# sidecar-medic as a container image: `docker build -t sidecar-medic:0.1.0 .` (docs/deploy.md).
# Stage 1 compiles the LD_PRELOAD shim and the trend kernels (setup.py) and installs medic into a
# virtualenv with the versions of constraints.txt (the ones the footprint in docs/performance.md was measured with);
# stage 2 copies that virtualenv onto the same Debian 12 Python base, without a compiler.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE constraints.txt ./
COPY medic_hook/ medic_hook/
COPY agent/ agent/
COPY probes/ probes/
COPY remediation/ remediation/
COPY native_hooks/ native_hooks/
COPY dashboards/ dashboards/
RUN python -m venv /opt/medic \
    && PIP_CONSTRAINT=/src/constraints.txt /opt/medic/bin/pip install --no-cache-dir /src \
    && /opt/medic/bin/medic hook path

FROM ${PYTHON_IMAGE}
# libjemalloc2: for `medic hook install DIR --allocator jemalloc` (a copy for the target) and for
# targets that medic launches itself (`medic run -- CMD`). Nothing else is exec'd by the probes:
# /proc and cgroup files are read directly; jcmd belongs to the target's JDK, not to this image.
# tini: the container's init, so that medic is not PID 1: orphans are reaped and `docker stop`'s SIGTERM
# is forwarded to medic. `-s` makes it a subreaper where the pod's pause container is PID 1
# (shareProcessNamespace in deploy/kubernetes/sidecar.yaml).
RUN apt-get update \
    && apt-get install -y --no-install-recommends libjemalloc2 tini \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 medic \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/medic --shell /usr/sbin/nologin medic \
    && install -d -o 10001 -g 10001 -m 0700 /var/lib/medic \
    && install -d -o 10001 -g 10001 -m 0700 /run/medic \
    && install -d -m 0755 /etc/medic
COPY --from=builder /opt/medic /opt/medic
COPY deploy/container/medic.yaml /etc/medic/medic.yaml

ENV PATH=/opt/medic/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MEDIC_URL=http://127.0.0.1:9464 \
    MEDIC_TOKEN_FILE=/var/lib/medic/admin.token

# numeric, so that Kubernetes' runAsNonRoot can check it; run the target as the same uid (docs/deploy.md)
USER 10001:10001
WORKDIR /var/lib/medic
VOLUME ["/var/lib/medic", "/run/medic"]
EXPOSE 9464
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['MEDIC_URL'] + '/healthz', timeout=4)"]
ENTRYPOINT ["/usr/bin/tini", "-s", "--", "medic"]
CMD ["run", "--config", "/etc/medic/medic.yaml"]
