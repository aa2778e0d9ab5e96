"""streamfilter: private continual monitoring with a per-user individual privacy filter."""

__version__ = "0.1.0"
