"""Simulated GPU cluster with fault injection and ground truth (`fleetwatch simulate`, `eval`).

The core (Simulation) is clock-free and Kafka-free: it yields each tick's messages as
(topic, key, message dict) tuples. cli.py drives it live into Kafka.
"""

from fleetwatch.collectors.sim.kinds import KINDS
from fleetwatch.collectors.sim.scenario import Scenario, load_scenario, packaged_path, packaged_scenarios
from fleetwatch.collectors.sim.simulation import Message, Simulation

__all__ = [
    "KINDS",
    "Message",
    "Scenario",
    "Simulation",
    "load_scenario",
    "packaged_path",
    "packaged_scenarios",
]
