"""pytest fixtures: vLLM 0.33.0's scheduling code loaded once per session from its
wheel (MOONCAKE_LOOKUP_VLLM_WHEEL, default <repo>/target/vllm-wheel/vllm-0.33.0-*.whl,
downloaded by scripts/python/env.sh)."""

import glob
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)


def wheel_path():
    path = os.environ.get("MOONCAKE_LOOKUP_VLLM_WHEEL")
    if path:
        return path
    found = sorted(glob.glob(os.path.join(ROOT, "target", "vllm-wheel", "vllm-0.33.0-*.whl")))
    if not found:
        pytest.fail("vLLM 0.33.0's wheel is missing: run `source scripts/python/env.sh` with "
                    "VENV and WHEEL_DIR set (it downloads it into target/vllm-wheel) or set "
                    "MOONCAKE_LOOKUP_VLLM_WHEEL")
    return found[0]


@pytest.fixture(scope="session")
def core():
    import vllm_core
    return vllm_core.load(wheel_path())


@pytest.fixture(scope="session")
def wheel():
    return wheel_path()
