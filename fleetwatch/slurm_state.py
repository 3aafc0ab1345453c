"""What a Slurm node state says (sinfo's StateLong, as the adapter's slurm_node/1 carries it):
one reading for the adapter (alerts/slurm.py) and the accounting stage (pipeline/reliability)."""

from __future__ import annotations

_STATE_FLAGS = "*~#!%$@^-"  # sinfo's suffixes to a state (not responding, powered down, ...)
DRAINED_STATES = ("drain",)  # drained or draining
DOWN_STATES = ("down", "fail")  # DOWN or FAIL: people or Slurm hold the node


def state_parts(state: str) -> list[str]:
    """A sinfo state's parts, lower case, flags stripped: "mixed+drain*" -> ["mixed", "drain"]
    (a compound state names its base state and its flags, each of which counts)."""
    return [part.rstrip(_STATE_FLAGS) for part in state.lower().split("+")]


def state_is(state: str, *prefixes: str) -> bool:
    """Whether any part of a sinfo state (state_parts) starts with one of `prefixes`: `idle+drain`
    is drained, `mixed+down` down."""
    return any(part.startswith(prefixes) for part in state_parts(state))


def out_of_service(state: str) -> bool:
    """Whether the state keeps the node from jobs: drained (or draining), down, failed or in
    maintenance, in any part of a compound state (`idle+drain` too). Maintenance counts whoever
    holds it: the adapter's own validation reservation lifts its drain while the node is tested."""
    return state_is(state, *DRAINED_STATES, *DOWN_STATES, "maint")
