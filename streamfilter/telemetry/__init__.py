"""Telemetry releases: private statistics about the run itself, charged to the separate
``[telemetry]`` budget (docs/design.md §2.11) — coverage with every release
(:mod:`~streamfilter.telemetry.coverage`) and the opt-in active-set estimate
(:mod:`~streamfilter.telemetry.active_set`). Pure: continual counters over exact day counts, no
I/O; the daemon's wiring (charge once, resume, refuse a changed specification) is
``runtime/telemetry.py``."""
