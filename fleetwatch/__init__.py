"""fleetwatch: streaming telemetry anomaly detection for large GPU training clusters."""

__version__ = "0.1.0"
