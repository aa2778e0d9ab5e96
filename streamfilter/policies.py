"""Import shim: query policies live in :mod:`streamfilter.engine.policies`.

Configurations name policies as ``streamfilter.policies:standing_monitoring``; that public name
keeps working.
"""

from streamfilter.engine.policies import (
    ActiveFraction,
    active_fraction,
    drill_down,
    standing_monitoring,
    stop_when_inactive,
)

__all__ = [
    "ActiveFraction",
    "active_fraction",
    "drill_down",
    "standing_monitoring",
    "stop_when_inactive",
]
