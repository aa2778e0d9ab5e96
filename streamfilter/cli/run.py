"""``streamfilter run``: the daemon, until SIGTERM (or the end of the input with ``--until-end``)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from types import FrameType

from streamfilter.config import load_config


def cmd_run(args: argparse.Namespace) -> int:
    import threading

    # SIGTERM/SIGINT are handled from the first moment: a stop requested while the store, the
    # source and the sinks are still opening is honoured as soon as the daemon exists.
    stop_requested = threading.Event()
    daemon_ref: list[object] = []

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()
        for d in daemon_ref:
            d.stop()  # type: ignore[attr-defined]

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    from streamfilter import _native
    from streamfilter.runtime.app import build_daemon, kafka_errors_explained, startup_summary
    from streamfilter.runtime.memory import (
        MMAP_THRESHOLD_BYTES,
        keep_freed_memory,
        return_free_heap,
    )

    kept = keep_freed_memory()  # before the run allocates its arrays
    settings = load_config(args.config)
    with kafka_errors_explained(settings):
        parts = build_daemon(
            settings,
            follow=not args.until_end,
            allow_test_seed=args.testing,
            stop=stop_requested,
        )
        logging.getLogger("streamfilter.run").info("%s", startup_summary(settings, parts))
        parts.daemon.intake.return_free_heap = return_free_heap()
        if kept:
            logging.getLogger("streamfilter.run").info(
                "memory: freed memory is kept for reuse while records flow (allocations below "
                "%d MiB come from the heap) and handed back when the input goes quiet",
                MMAP_THRESHOLD_BYTES >> 20,
            )
        not_built = _native.missing()
        if _native.impl() == "python":
            logging.getLogger("streamfilter.run").info(
                "%s=python: the pure-Python paths run", _native.ENV
            )
        elif not_built:
            logging.getLogger("streamfilter.run").warning(
                "native helpers not built (%s): the pure-Python paths run, with the same results "
                "and slower; install a C compiler and reinstall (pip install -e .)",
                ", ".join(not_built),
            )
        daemon_ref.append(parts.daemon)
        if stop_requested.is_set():
            parts.daemon.stop()
        try:
            summary = parts.daemon.run(until_end=args.until_end)
        finally:
            parts.close()
    print(json.dumps({"summary": summary.as_dict()}), file=sys.stderr)
    return 0
