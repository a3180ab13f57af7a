"""What the Python package's tests share: the model, the engine settings the
e2e server runs with, the e2e suite's server helpers, and waiting for the
engine to go idle."""
from __future__ import annotations

import importlib.util
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]

# The e2e suite's helpers (start/stop `inferd serve`), loaded under a name of
# their own: both test folders have a conftest.py.
_spec = importlib.util.spec_from_file_location("inferd_e2e_helpers", REPO / "tests" / "e2e" / "conftest.py")
e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = e2e  # its dataclasses look their module up
_spec.loader.exec_module(e2e)

DEFAULT_MODEL = e2e.DEFAULT_MODEL
MAX_MODEL_LEN = e2e.MAX_MODEL_LEN
# The e2e server's settings, so that both engines are alike.
ENGINE_ARGS = dict(max_model_len=MAX_MODEL_LEN, kv_cache_memory="256M", threads=2)


def wait_idle(engine, timeout: float = 10.0) -> dict:
    """The engine's stats once nothing runs or waits and every KV block is free."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        s = engine.stats()
        if s["num_running"] == 0 and s["num_waiting"] == 0 and s["kv_used_blocks"] == 0:
            return s
        time.sleep(0.05)
    raise AssertionError(f"the engine did not go idle: {engine.stats()}")
