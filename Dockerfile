# syntax=docker/dockerfile:1
# Motor on JetStream: one image for every process (`motor controller`, `motor coordinator`,
# `motor nodeagent`, which launches the builtin engine from the same venv). The Kubernetes
# manifests (deploy/k8s) run it as user 10001. For vLLM or SGLang node agents build on their
# image instead: docs/kubernetes.md, "Engine images".
#
#   docker build -t motor-jetstream:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------- build: the venv, compiled
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/motor
WORKDIR /src
COPY pyproject.toml README.md ./
COPY core/ core/
COPY streams/ streams/
COPY replay/ replay/
COPY http1/ http1/
COPY simengine/ simengine/
COPY controller/ controller/
COPY coordinator/ coordinator/
COPY nodeagent/ nodeagent/
COPY deploy/ deploy/
# The `vllm` extra is `motor model tiny`'s builder (numpy, safetensors, tokenizers, jinja2),
# not vLLM itself; `dev` and `bench` are for this repo's tests and benchmarks.
RUN /opt/motor/bin/pip install ".[vllm]" \
    && /opt/motor/bin/motor --help >/dev/null

# ---------------------------------------------------------------- runtime: no compiler, no root
FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 motor \
    && useradd --system --uid 10001 --gid motor --home-dir /var/lib/motor --create-home motor
COPY --from=build /opt/motor /opt/motor
ENV PATH=/opt/motor/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /var/lib/motor
USER 10001:10001
# 8000 OpenAI API, 8001 management, 8100 controller, 8200 node agent, 9000+ engines.
EXPOSE 8000 8001 8100 8200 9000
ENTRYPOINT ["motor"]
CMD ["--help"]
