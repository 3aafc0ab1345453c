"""One Kafka client (issue 24): every producer, consumer and admin of the package goes through
fleetwatch/bus, on confluent-kafka. No module outside fleetwatch/bus imports a Kafka client
(confluent_kafka, or kafka-python's `kafka`), in the package's folders and in the tests (which use
the bus too). benchmarks/ may: kafka-python is their baseline (a dev dependency)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.paths import REPO

CHECKED = ("fleetwatch", "collectors", "pipeline", "detectors", "alerts", "scripts", "tests")
BUS = REPO / "fleetwatch" / "bus"
CLIENTS = ("confluent_kafka", "kafka")


def _client_imports(path: Path, root: Path = REPO) -> list[str]:
    """`import X` / `from X import ...` of a client package, wherever they stand in the module (a
    function-level import counts too); `__import__("kafka")` and importlib by a literal name also."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found: list[str] = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            names = [node.args[0].value]
        found += [f"{path.relative_to(root)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in CLIENTS]
    return found


def _files() -> list[Path]:
    files = [p for folder in CHECKED for p in (REPO / folder).rglob("*.py")]
    return sorted(p for p in files if BUS not in p.parents)


def test_the_check_sees_every_package_folder_and_the_tests() -> None:
    seen = {p.relative_to(REPO).parts[0] for p in _files()}
    assert seen >= {"fleetwatch", "collectors", "pipeline", "detectors", "alerts", "tests"}


def test_the_check_finds_a_client_import(tmp_path: Path) -> None:
    # what it must catch, written out: an import anywhere in a module, in each form
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import json\nfrom kafka.errors import KafkaError\n\n\ndef f():\n"
        "    import confluent_kafka.admin\n    return __import__('kafka')\n",
        encoding="utf-8",
    )
    got = _client_imports(probe, tmp_path)
    assert got == ["probe.py:2: kafka.errors", "probe.py:6: confluent_kafka.admin", "probe.py:7: kafka"]


def test_no_module_outside_the_bus_imports_a_kafka_client() -> None:
    offenders = [hit for p in _files() for hit in _client_imports(p)]
    assert offenders == [], "import Kafka through fleetwatch/bus only:\n" + "\n".join(offenders)


def test_the_bus_is_on_confluent_kafka_only() -> None:
    hits = [hit for p in sorted(BUS.rglob("*.py")) for hit in _client_imports(p)]
    assert hits and all(hit.split(": ")[1].startswith("confluent_kafka") for hit in hits), hits


# librdkafka (issue 5040, still in 2.16) dereferences the admin handle's missing consumer group when
# a ListConsumerGroupOffsets answer says NOT_COORDINATOR: the process dies of SIGSEGV. It killed
# benchmarks.rsc1 on a loaded CI machine; a fresh broker's first seconds make it likely.
# fleetwatch/bus/admin.py asks a group's offsets through a consumer's committed() instead.
CRASHING_CALLS = ("list_consumer_group_offsets",)


def _crashing_calls(path: Path, root: Path = REPO) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [
        f"{path.relative_to(root)}:{node.lineno}: {node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in CRASHING_CALLS
    ]


def test_the_crash_check_finds_the_call(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f(admin, req):\n    return admin.client.list_consumer_group_offsets([req])\n")
    assert _crashing_calls(probe, tmp_path) == ["probe.py:2: list_consumer_group_offsets"]


def test_nothing_asks_group_offsets_through_the_admin_api_that_crashes_librdkafka() -> None:
    files = sorted(p for folder in (*CHECKED, "benchmarks") for p in (REPO / folder).rglob("*.py"))
    offenders = [hit for p in files for hit in _crashing_calls(p)]
    assert offenders == [], "use fleetwatch.bus.admin.Admin.group_offsets:\n" + "\n".join(offenders)
