"""The kernel log as a source: its line formats (lines.py), the NVIDIA driver's and the PCIe
layer's events in it (events.py), and the node's own record read with a persisted cursor (kmsg.py,
journal.py, source.py)."""
