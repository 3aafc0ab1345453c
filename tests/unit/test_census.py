"""The census of reporting nodes (fleetwatch/census.py): node/1 validation. The table act builds
from the compacted fleet.nodes.v1, read from the real broker: tests/integration/test_census.py."""

from __future__ import annotations

import pytest

from fleetwatch import schemas
from fleetwatch.census import NODE, node_message

T0 = 1_800_000_000.0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"node": "bad node"}, "out_of_range"),
        ({"first_seen": -1}, "out_of_range"),
        ({"last_seen": T0 - 1}, "out_of_range"),  # before first_seen
        ({"last_seen": "yesterday"}, "wrong_type"),
    ],
)
def test_node_messages_are_validated(change: dict[str, object], reason: str) -> None:
    good = node_message("gpu-node-01", T0, T0 + 60)
    assert schemas.decode(schemas.encode(good), NODE) == good
    with pytest.raises(schemas.MessageError) as e:
        schemas.decode(schemas.encode({**good, **change}), NODE)
    assert e.value.reason == reason
    with pytest.raises(schemas.MessageError) as e:
        schemas.decode(schemas.encode({k: v for k, v in good.items() if k != "last_seen"}), NODE)
    assert e.value.reason == "missing_field"
