"""User-side mode: each device runs its own individual filter (Feldman & Zrnic Remark 4.6).

Imports only the pure privacy core, numpy and the standard library, so it can ship to devices
without the server's dependencies. See docs/local-mode.md and SECURITY.md for the trust model.
"""

from streamfilter.client.core import DeviceConfig, Variant, answer_day
from streamfilter.client.device import LocalFilter, day_record
from streamfilter.client.fleet import DeviceFleet
from streamfilter.client.protocol import Announcement, AnnouncementError, Contribution

__all__ = [
    "Announcement",
    "AnnouncementError",
    "Contribution",
    "DeviceConfig",
    "DeviceFleet",
    "LocalFilter",
    "Variant",
    "answer_day",
    "day_record",
]
