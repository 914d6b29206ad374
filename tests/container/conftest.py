"""The container tests run only where podman can run the image `make image` built; elsewhere they skip.

`make test-container` has just built the image, so it passes --container-required: a skip there would hide
a broken setup, and fails instead.
"""

from __future__ import annotations

import pytest

from tests.container.podman import unavailable_reason

REQUIRED = "--container-required"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(REQUIRED, action="store_true", help="fail, not skip, where podman cannot run the image")


@pytest.fixture(scope="session")
def podman_ready(request: pytest.FixtureRequest) -> None:
    reason = unavailable_reason()
    if reason is None:
        return
    if request.config.getoption(REQUIRED):
        pytest.fail(reason)
    pytest.skip(reason)
