"""The container tests run only where podman can run the image `make image` built; elsewhere they skip."""

from __future__ import annotations

import pytest

from tests.container.podman import unavailable_reason


@pytest.fixture(scope="session")
def podman_ready() -> None:
    reason = unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
