"""A TopicFollower run for the length of a `with` block (tests of followers and their tables)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fleetwatch.follow import TopicFollower


@contextlib.contextmanager
def following(follower: TopicFollower) -> Iterator[TopicFollower]:
    """Started on entry; stopped and joined on exit, whatever the block raised."""
    follower.start()
    try:
        yield follower
    finally:
        follower.stop()
        follower.join(30)
