"""streamfilter: private continual monitoring with a per-user individual privacy filter.

``Monitor`` is the Python API (no I/O); ``streamfilter run`` is the daemon on the same engine.
"""

from streamfilter.engine.contract import Release
from streamfilter.engine.monitor import Monitor

__version__ = "0.1.0"
__all__ = ["Monitor", "Release", "__version__"]
