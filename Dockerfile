# kserve-canary controller image.
#
# * two stages: the virtualenv is built in the first, only the virtualenv is copied into the second;
# * a slim Python base (Debian 12 "bookworm", CPython 3.11); no compiler, no pip in the final venv;
# * runs as the non-root user 65532 and writes nothing at runtime, so it works with
#   readOnlyRootFilesystem: true (the manifests mount an emptyDir at /tmp for libraries that want one);
# * `kserve-canary run` is the entrypoint; arguments after the image name are `run` flags.
#
# Size (tests/deploy/test_dockerfile.py recomputes it from the same prune list): the base image is
# about 125 MB, the virtualenv layer about 82 MB. The kubernetes client ships an asyncio twin of
# itself (kubernetes/aio, ~41 MB, plus aiohttp and its helpers, ~10 MB) that kserve-canary never
# imports: it is removed. Bytecode is compiled only for the modules the controller imports, so a
# start-up does not compile ~700 modules in memory (1.8 s instead of 3.4 s, 80 MB instead of 150 MB
# peak RSS) without storing bytecode for the rest.
#
# Supply chain: every runtime distribution is installed from requirements/controller.txt, a lock
# compiled from pyproject.toml's dependencies with a sha256 for every file (`pip install
# --require-hashes` refuses anything unlisted, unpinned or altered); the wheel is built with the
# locked setuptools of requirements/build.txt and installed with --no-deps. Regenerate both with
# the commands in their headers (docs/install.md#supply-chain); tests/deploy/test_supply_chain.py
# checks that the locks and pyproject.toml agree.
#
# The base image is pinned by digest, so `docker build .` always builds on the same bytes, never on
# whatever the tag points to today. The default digest below is the one a public repository's
# documentation records as verified for python:3.11-slim-bookworm (found with a code search of
# public repositories pinning `python:3.11-slim-bookworm@sha256:`; this repository's CI cannot reach
# Docker Hub to resolve it). The release workflow (.github/workflows/release.yml) resolves it with
# `docker buildx imagetools inspect` before it builds and fails if it does not exist, and Renovate
# (.github/renovate.json) proposes the tag's newer digests as pull requests. To build on another
# digest (after checking it):
#   docker buildx imagetools inspect python:3.11-slim-bookworm --format '{{json .Manifest.Digest}}'
#   (or: crane digest python:3.11-slim-bookworm)
#   docker build --build-arg PYTHON_DIGEST=sha256:<64 hex> -t kserve-canary .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG PYTHON_DIGEST=sha256:2e32f7d302adc1c37428355c1e646897c0c53f4fd60b6a551245fb90ee129f91

FROM ${PYTHON_IMAGE}@${PYTHON_DIGEST} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
# The dependencies first (their layer is reused while only the code changes): binary wheels only,
# so no sdist runs an unlocked build backend.
COPY requirements/controller.txt requirements/build.txt ./requirements/
RUN python -m venv --without-pip /opt/kserve-canary \
 && pip --python /opt/kserve-canary/bin/python install --no-compile --no-cache-dir --require-hashes --only-binary=:all: -r requirements/controller.txt \
 && pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements/build.txt
COPY pyproject.toml README.md ./
COPY canary ./canary
# Distributions only kubernetes.aio needs; removed together with it (never imported by kserve-canary).
ARG PRUNE_DISTRIBUTIONS="aiohttp aiohttp-retry aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl"
RUN pip wheel --no-deps --no-build-isolation --no-cache-dir --wheel-dir /tmp/dist . \
 && pip --python /opt/kserve-canary/bin/python install --no-compile --no-cache-dir --no-deps /tmp/dist/kserve_canary-*.whl \
 && pip --python /opt/kserve-canary/bin/python uninstall --yes ${PRUNE_DISTRIBUTIONS} \
 && rm -rf /opt/kserve-canary/lib/python3.*/site-packages/kubernetes/aio \
 && /opt/kserve-canary/bin/python -c "import sys, py_compile, canary.cli, canary.cli.controller; [py_compile.compile(m.__file__, doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH) for m in list(sys.modules.values()) if (getattr(m, '__file__', None) or '').startswith('/opt/kserve-canary/') and m.__file__.endswith('.py')]" \
 && /opt/kserve-canary/bin/kserve-canary --version

FROM ${PYTHON_IMAGE}@${PYTHON_DIGEST}
LABEL org.opencontainers.image.title="kserve-canary" \
      org.opencontainers.image.description="Automated, evidence-driven canary rollouts for KServe InferenceServices" \
      org.opencontainers.image.source="https://github.com/kserve-canary/kserve-canary" \
      org.opencontainers.image.licenses="Apache-2.0"
# A passwd entry for 65532 ("nonroot", as in distroless images) so getpass and ~ resolve; no home.
RUN groupadd --gid 65532 nonroot \
 && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
ENV PATH=/opt/kserve-canary/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    POLICY_DIR=/etc/kserve-canary/policies
COPY --from=build /opt/kserve-canary /opt/kserve-canary
USER 65532:65532
# /metrics, /healthz and /readyz (--metrics-port).
EXPOSE 8080
ENTRYPOINT ["kserve-canary", "run"]
CMD ["--log-format", "json"]
