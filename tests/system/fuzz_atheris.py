"""Optional coverage-guided fuzzing of the input boundaries with atheris (libFuzzer).

Not collected by pytest and not a dependency: ``pip install atheris`` first, then e.g.

    .venv/bin/python tests/system/fuzz_atheris.py event -max_total_time=60
    .venv/bin/python tests/system/fuzz_atheris.py query -runs=100000
    .venv/bin/python tests/system/fuzz_atheris.py config -max_total_time=60
    .venv/bin/python tests/system/fuzz_atheris.py scan -max_total_time=60

Targets: ``event`` (``parse_event`` on raw bytes; an accepted event must satisfy the contract and
be storable as UTF-8), ``query`` (``parse_query``; an accepted query must survive a day close),
``config`` (``load_config`` on the bytes written to a file: only ``ConfigError`` may escape),
``scan`` (the batch decoder, ``engine/ingest.py`` over the native scanner ``engine/_jsonl.c``, on
one to three lines: each line decides as ``parse_event`` decides, with the same values or reason;
``make sanitize`` builds the scanner with ASan + UBSan and fuzzes it with hypothesis).
Any other exception is a finding; libFuzzer writes the input to ``crash-*``. The first input byte
picks raw bytes or a fuzzer-built JSON object, so coverage guidance reaches the validators behind
the C JSON parser. Known defects (the ``xfail`` tests of ``tests/system/test_fuzz.py``) are skipped unless
``STREAMFILTER_FUZZ_STRICT=1``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

import atheris

# third-party modules first, uninstrumented (instrumenting numpy/scipy/pydantic is slow and useless)
import numpy  # noqa: F401
import pydantic  # noqa: F401
import pydantic_settings  # noqa: F401
import scipy.optimize
import scipy.special
import scipy.stats  # noqa: F401

with atheris.instrument_imports(include=["streamfilter"]):
    from streamfilter import Monitor
    from streamfilter.config import load_config
    from streamfilter.engine import ingest
    from streamfilter.engine.contract import Event, Reject, parse_event, parse_query
    from streamfilter.errors import ConfigError


_KEYS = ["user_id", "day", "values", "event_id", "query_id", "kind", "features", "feature"]
_KEYS += ["categories", "weights", "labels", "clip", "from_day", "until_day", "x"]


def _value(fdp: atheris.FuzzedDataProvider, depth: int = 0) -> object:
    """A JSON-like value steered by the fuzzer (so coverage guidance reaches the validators,
    which sit behind the C JSON parser)."""
    kind = fdp.ConsumeIntInRange(0, 9 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return fdp.ConsumeBool()
    if kind == 2:
        return fdp.ConsumeInt(fdp.ConsumeIntInRange(1, 64))
    if kind == 3:
        return fdp.ConsumeRegularFloat() if fdp.ConsumeBool() else fdp.ConsumeFloat()
    if kind == 4:
        return fdp.PickValueInList(["2026-01-01", "2026-02-29", "sum", "histogram", "linear"])
    if kind == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 300))
    if kind == 6:
        return fdp.ConsumeUnicode(fdp.ConsumeIntInRange(0, 8))  # may hold lone surrogates
    if kind == 7:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    return {
        (fdp.PickValueInList(_KEYS) if fdp.ConsumeBool() else fdp.ConsumeUnicode(4)): _value(
            fdp, depth + 1
        )
        for _ in range(fdp.ConsumeIntInRange(0, 6))
    }


def _input(data: bytes) -> bytes | dict:
    """Half the time raw bytes, half the time a fuzzer-built object (as a dict or JSON)."""
    if not data or data[0] < 128:
        return data[1:]
    fdp = atheris.FuzzedDataProvider(data[1:])
    obj = _value(fdp)
    if not isinstance(obj, dict):
        obj = {"x": obj}
    if fdp.ConsumeBool():
        return obj
    try:
        return json.dumps(obj).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError):
        return obj


def fuzz_event(data: bytes) -> None:
    raw = _input(data)
    if isinstance(raw, dict) and not all(isinstance(k, str) for k in raw):
        return
    try:
        ev = parse_event(raw)
    except Reject:
        return
    assert 1 <= len(ev.user_id) <= 256
    for name, v in ev.values.items():
        assert name and "=" not in name
        assert isinstance(v, str) or (math.isfinite(v) and abs(v) <= 1e12)
    if STRICT:
        ev.user_id.encode("utf-8")  # must be storable (SQLite TEXT is UTF-8): known defect


def fuzz_query(data: bytes) -> None:
    try:
        q = parse_query(_input(data))
    except Reject:
        return
    if not STRICT and q.clip / 2.0**-10 > 2**31:
        return  # known defect: such a clip is accepted but every day close raises
    m = Monitor(b_norm=1.0, rho=1.0, test_seed=0)
    m.engine.register_query(q)
    day = q.from_day.isoformat()
    m.close_day(day, [{"user_id": "u", "day": day, "values": {c: 1.0 for c in q.coordinates()}}])


#: the registered queries' feature kinds the scan target decodes under
_SCAN_KINDS = [None, {"active": False, "plan": True}, {"a": True}]


def fuzz_scan(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    kinds = _SCAN_KINDS[fdp.ConsumeIntInRange(0, len(_SCAN_KINDS) - 1)]
    lines = [
        fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300)) for _ in range(fdp.ConsumeIntInRange(1, 3))
    ]
    got = ingest.parse_events(lines, kinds)
    columns = ingest.parse_columns(lines, kinds)
    if columns is not None:
        assert columns.events() == got
    for item, line in zip(got, lines, strict=True):
        try:
            want: Event | Reject = parse_event(line, kinds)
        except Reject as rej:
            want = rej
        if isinstance(want, Reject):
            assert isinstance(item, Reject) and (item.reason, item.detail) == (
                want.reason,
                want.detail,
            )
            continue
        assert isinstance(item, Event)
        assert (item.user_id, item.day, item.event_id) == (want.user_id, want.day, want.event_id)
        assert set(item.values) == set(want.values)
        assert [repr(item.values[k]) for k in want.values] == list(map(repr, want.values.values()))


_TMP = Path(tempfile.mkdtemp(prefix="sf-atheris-"))


def fuzz_config(data: bytes) -> None:
    path = _TMP / "c.toml"
    path.write_bytes(data)
    try:
        load_config(path)
    except ConfigError:
        return
    except (UnicodeDecodeError, RecursionError, TypeError):
        if (
            STRICT
        ):  # known defects (tests/system/test_fuzz.py): not UTF-8, deep nesting, "_env_*" keys
            raise


#: STREAMFILTER_FUZZ_STRICT=1 also reports the known defects pinned in tests/system/test_fuzz.py
STRICT = os.environ.get("STREAMFILTER_FUZZ_STRICT") == "1"
TARGETS = {"event": fuzz_event, "query": fuzz_query, "config": fuzz_config, "scan": fuzz_scan}


SEEDS = {
    "event": [
        b'{"user_id": "u-17", "day": "2026-01-05", "values": {"active": 1, "plan": "pro"}, '
        b'"event_id": "e-991"}',
    ],
    "query": [
        b'{"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0, '
        b'"from_day": "2026-01-01"}',
        b'{"query_id": "plans", "kind": "histogram", "feature": "plan", "categories": ["free", '
        b'"pro"], "clip": 1.0, "from_day": "2026-01-10", "until_day": "2026-01-20"}',
        b'{"query_id": "mix", "kind": "linear", "weights": {"active": [1, 0], "minutes": [0, 0.01]}'
        b', "clip": 2.0, "from_day": "2026-01-10", "labels": ["a", "b"]}',
    ],
    "scan": [
        b"\x00\x01\x60"
        + b'{"user_id": "u-17", "day": "2026-01-05", "values": {"active": 1, "plan": "pro"}, '
        b'"event_id": "e-991"}',
    ],
    "config": [
        b'[privacy]\nb_norm = 4.0\nrho = 0.5\ngranularity = 0.0009765625\nexhaustion = "skip"\n'
        b'[window]\nallowed_lateness = "2h"\n[source]\nkind = "synthetic"\n[sink]\nkind = "stdout"\n',
    ],
}


def main() -> None:
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(TARGETS)}}} [libFuzzer options] [corpus dirs]")
    name = sys.argv[1]
    for key in [k for k in os.environ if k.upper().startswith("STREAMFILTER_")]:
        del os.environ[key]
    args = sys.argv[2:]
    if not any(not a.startswith("-") for a in args):  # no corpus given: seed a fresh one
        corpus = _TMP / f"corpus-{name}"
        corpus.mkdir(exist_ok=True)
        for i, seed in enumerate(SEEDS[name]):
            prefix = b"" if name in ("config", "scan") else b"\x00"  # first byte < 128: raw mode
            (corpus / f"seed-{i}").write_bytes(prefix + seed)
        args.append(str(corpus))
    atheris.Setup([sys.argv[0], *args], TARGETS[name])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
