"""Real services for the action layer's tests: Alertmanager (services/alertmanager/alertmanager.sh)
and Slurm (services/slurm/slurm.sh). Their fixtures (tests/integration/conftest.py) fail loudly
when a service cannot start: these tests are about the real thing, so there is nothing to skip to.
The classes the fixtures return are in tests/integration/services.py."""

from __future__ import annotations

from tests.integration.services import AM_SH, SLURM_NODES, SLURM_SH, USES_SLURM, Alertmanager, Slurm, service

pytestmark = USES_SLURM


def test_service_scripts_are_idempotent(alertmanager: Alertmanager, slurm: Slurm) -> None:
    alertmanager.start()  # a second start reuses the running instance
    service(AM_SH, "status", **alertmanager.env)
    service(SLURM_SH, "start")
    service(SLURM_SH, "status")
    assert alertmanager.alerts(cluster="nobody") == []
    assert {slurm.state(n)[0].rstrip("*") for n in SLURM_NODES} <= {"idle", "drained"}
