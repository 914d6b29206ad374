"""One live KnitTrans stack for the session, shared by the live metric test and the Prometheus test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.deploy.live_services import (
    INITIAL_VERSION,
    LiveStack,
    drive_traffic,
    scrape,
    start_admission,
    start_reorg_sidecar,
)


@pytest.fixture(scope="session")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    directory = tmp_path_factory.mktemp("live-stack")
    admission = start_admission(directory, initial_version=INITIAL_VERSION)
    try:
        token = admission.config.knittrans_env["KNITTRANS_SERVER__AUTH__TOKEN"]
        sidecar = start_reorg_sidecar(directory, admission=admission, token=token)
        try:
            reorg_metrics = scrape(sidecar.metrics_port)
        finally:
            # It would try to read the traffic's units, which exist only as metadata.
            exit_code = sidecar.process.stop()
        assert exit_code == 0, f"the reorg sidecar did not stop cleanly ({exit_code}):\n{sidecar.process.tail()}"
        traffic = drive_traffic(admission.address, token)
        yield LiveStack(admission=admission, token=token, traffic=traffic, reorg_metrics=reorg_metrics)
    finally:
        admission.process.stop()
