"""The unit tier: no service (no Kafka broker, Alertmanager, Prometheus or Slurm, and no promtool,
amtool, docker compose or Node.js), and the whole tier in under 2 minutes. A test here that asks
for a service fixture fails at setup, loudly, instead of starting the service or failing on a
missing fixture: it belongs in tests/integration/."""

from __future__ import annotations

import pytest

# The fixtures of tests/integration/conftest.py that start or reach a real service. A fixture of
# a test module that needs one of them (detect, jobs, drainer, rig, stack, ...) requests it, so
# item.fixturenames (the transitive closure) names it too.
SERVICE_FIXTURES = frozenset({"kafka_bootstrap", "topic_tail", "private_broker", "alertmanager", "slurm"})


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    wanted = sorted(SERVICE_FIXTURES.intersection(getattr(item, "fixturenames", ())))
    if wanted:
        pytest.fail(
            f"{item.nodeid} is in the unit tier but requests service fixture(s) {', '.join(wanted)}: "
            "move it to tests/integration/",
            pytrace=False,
        )
