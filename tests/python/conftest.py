"""Fixtures of the Python package's tests: one LLM on the default model, and
`inferd serve` on the same model and settings to compare with.

The package must be installed first (`pip install .`, as scripts/test.sh does).
"""
from __future__ import annotations

import pytest

from pkg_support import DEFAULT_MODEL, ENGINE_ARGS, e2e


@pytest.fixture(scope="session")
def llm():
    import inferd

    if not DEFAULT_MODEL.exists():
        pytest.fail(f"{DEFAULT_MODEL} is missing: run scripts/setup.sh")
    return inferd.LLM(str(DEFAULT_MODEL), **ENGINE_ARGS)


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    srv = e2e.start(tmp_path_factory.mktemp("server"))
    yield srv
    code = e2e.stop(srv)
    assert code == 0, f"inferd serve exited with {code} after SIGTERM:\n{srv.log()[-4000:]}"
