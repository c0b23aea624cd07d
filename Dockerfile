# syntax=docker/dockerfile:1
# kserve-canary controller image: a slim Python runtime, a virtualenv built in a separate stage,
# a non-root user, and nothing written at runtime (works with readOnlyRootFilesystem: true).

FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY canary ./canary
RUN python -m venv /opt/kserve-canary \
 && /opt/kserve-canary/bin/pip install --no-compile . \
 && find /opt/kserve-canary -name '__pycache__' -type d -prune -exec rm -rf {} +

FROM python:3.11-slim-bookworm
LABEL org.opencontainers.image.title="kserve-canary" \
      org.opencontainers.image.description="Automated, evidence-driven canary rollouts for KServe InferenceServices" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/kserve-canary/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    POLICY_DIR=/etc/kserve-canary/policies
COPY --from=build /opt/kserve-canary /opt/kserve-canary
# 65532 is the conventional "nonroot" uid of distroless images; no shell login, no home writes.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["kserve-canary", "run"]
CMD ["--log-format", "json"]
