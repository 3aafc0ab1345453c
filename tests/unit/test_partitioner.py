"""The bus's partitioner matches Kafka's: the Java client's own test vectors (UtilsTest.testMurmur2)."""

import pytest

from fleetwatch.bus.partitioner import murmur2, partition_for

JAVA_VECTORS = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("data", "expected"), JAVA_VECTORS.items())
def test_murmur2_matches_the_java_clients_vectors(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_partition_for_is_the_positive_hash_modulo_the_partition_count() -> None:
    for data, h in JAVA_VECTORS.items():
        assert partition_for(data, 12) == (h & 0x7FFFFFFF) % 12
    with pytest.raises(ValueError):
        partition_for(b"x", 0)
