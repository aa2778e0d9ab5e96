"""streamfilter: private continual monitoring with a per-user individual privacy filter.

``Monitor`` is the Python API (no I/O); ``streamfilter run`` is the daemon on the same engine;
``streamfilter.client`` is the device side of local mode. The top-level names load lazily, so a
device importing ``streamfilter.client`` gets only the privacy core (no pydantic, no server).
"""

import typing as _typing

if _typing.TYPE_CHECKING:
    from streamfilter.engine.contract import Release
    from streamfilter.engine.monitor import Monitor

__version__ = "0.1.0"
__all__ = ["Monitor", "Release", "__version__"]


def __dir__() -> list[str]:
    """The public names only (the lazily loaded ones included), so ``dir(streamfilter)`` shows
    ``Monitor`` and not the typing helpers this module imports."""
    return sorted(__all__)


def __getattr__(name: str) -> _typing.Any:
    if name == "Monitor":
        from streamfilter.engine.monitor import Monitor

        return Monitor
    if name == "Release":
        from streamfilter.engine.contract import Release

        return Release
    raise AttributeError(f"module 'streamfilter' has no attribute {name!r}")
