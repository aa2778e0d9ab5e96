"""``recovery_seconds``: SIGKILL in the middle of a day → the day released, vs an uninterrupted run.

Setup (untimed): a file source whose first part is a closed day ``D-1`` (``n/4`` users, one
event each) and a state that has closed it (``streamfilter run --until-end``). Then the file
gets day ``D``: ``n`` events from ``n/4`` users (4 each: ``active``, ``minutes``, ``plan``), and
one event of ``D+1`` (the input moves past ``D``; ``allowed_lateness = 0``, ``D`` is in the past,
so ``D`` closes as soon as it has been read). 3 standing queries. Each run starts from a fresh
copy of that state and sink; the daemon runs as a real process (``streamfilter run``, follow
mode, metrics on).

* baseline (uninterrupted): process start → day ``D``'s releases in the release file;
* recovery: the run's file holds only the first half of day ``D`` when the daemon starts, so
  the day cannot close before the kill; SIGKILL once its metrics show that half read, append the
  rest of the file (the producer went on while the daemon was down), start it again; time from
  the restart → day ``D``'s releases in the release file.

ratio = recovery ÷ uninterrupted (lower is better; no target). Only closed days are
durable (one transaction per closed day, docs/design.md §5), so after a crash the open day is read
again from its first offset: recovery is bounded below by restart + re-reading the day.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.common import entry
from streamfilter.policies import standing_monitoring

DAY_BEFORE, DAY, DAY_AFTER = "2026-01-04", "2026-01-05", "2026-01-06"
# the example policy's three standing queries (active, plans, hours); from_day set per run
QUERIES = standing_monitoring([], "2026-01-01")
TIMEOUT_S = 600.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _event(user: int, day: str, i: int) -> bytes:
    plan = ("free", "pro", "team")[user % 3]
    values = {"active": 1, "minutes": float(i % 90), "plan": plan}
    return json.dumps({"user_id": f"u-{user}", "day": day, "values": values}).encode() + b"\n"


def _config(run_dir: Path, events: Path, port: int) -> Path:
    cfg = run_dir / "streamfilter.toml"
    cfg.write_text(
        f"""
[privacy]
b_norm = 64.0
rho = 0.5
[window]
allowed_lateness = "0s"
idle_timeout = "10m"
poll_interval = "50ms"
[source]
kind = "file"
path = "{events}"
[queries]
kind = "file"
path = "{run_dir.parent / "queries.jsonl"}"
[sink]
kind = "file"
path = "{run_dir / "releases.jsonl"}"
[rejects]
kind = "file"
path = "{run_dir / "rejects.jsonl"}"
[state]
path = "{run_dir / "state.db"}"
[metrics]
enabled = true
port = {port}
"""
    )
    return cfg


def _start(cfg: Path, follow: bool = True) -> subprocess.Popen[bytes]:
    args = [sys.executable, "-m", "streamfilter", "run", "--config", str(cfg)]
    if not follow:
        args.append("--until-end")
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _released(releases: Path, day: str) -> bool:
    try:
        text = releases.read_text()
    except FileNotFoundError:
        return False
    return sum(1 for line in text.splitlines() if f'"day": "{day}"' in line) >= len(QUERIES)


def _wait_released(proc: subprocess.Popen[bytes], releases: Path, t0: float) -> float:
    while not _released(releases, DAY):
        if proc.poll() is not None:
            raise RuntimeError(f"daemon exited {proc.returncode}: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
        if time.perf_counter() - t0 > TIMEOUT_S:
            raise TimeoutError("day not released")
        time.sleep(0.01)
    return time.perf_counter() - t0


def _records_read(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1) as resp:
            body = resp.read().decode()
    except OSError:
        return 0
    return int(
        sum(
            float(line.rsplit(" ", 1)[1])
            for line in body.splitlines()
            if line.startswith("streamfilter_records_consumed_total{")
        )
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _prepare(work: Path, n: int) -> tuple[Path, Path, int]:
    """The events file (D-1, D, one D+1 event), a state dir that has closed D-1, and the byte
    offset in that file after the first half of day D."""
    users = max(1, n // 4)
    events = work / "events.jsonl"
    (work / "queries.jsonl").write_text(
        "".join(json.dumps({**q, "from_day": DAY_BEFORE}) + "\n" for q in QUERIES)
    )
    with events.open("wb") as f:
        f.writelines(_event(u, DAY_BEFORE, u) for u in range(users))
    prepared = work / "prepared"
    prepared.mkdir()
    proc = _start(_config(prepared, events, _free_port()), follow=False)
    if proc.wait(TIMEOUT_S) != 0:
        raise RuntimeError(f"preparing the state failed: {proc.stderr.read().decode()}")  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    assert _released(prepared / "releases.jsonl", DAY_BEFORE)
    with events.open("ab") as f:
        f.writelines(_event(i % users, DAY, i) for i in range(n // 2))
        half_day = f.tell()
        f.writelines(_event(i % users, DAY, i) for i in range(n // 2, n))
        f.write(_event(0, DAY_AFTER, 0))
    return events, prepared, half_day


def _fresh(work: Path, prepared: Path, name: str, events: Path) -> tuple[Path, Path, int]:
    run_dir = work / name
    shutil.copytree(prepared, run_dir)
    port = _free_port()
    return _config(run_dir, events, port), run_dir / "releases.jsonl", port


def uninterrupted(work: Path, prepared: Path, events: Path, name: str) -> float:
    cfg, releases, _ = _fresh(work, prepared, name, events)
    t0 = time.perf_counter()
    proc = _start(cfg)
    try:
        return _wait_released(proc, releases, t0)
    finally:
        _stop(proc)


def _copy_bytes(src: Path, dst: Path, start: int, stop: int | None) -> None:
    """Append ``src[start:stop]`` to ``dst``."""
    with src.open("rb") as f, dst.open("ab") as out:
        f.seek(start)
        out.write(f.read() if stop is None else f.read(stop - start))


def recovery(work: Path, prepared: Path, events: Path, name: str, half_day: int, n: int) -> float:
    """Seconds from the restart after a SIGKILL half-way through day D to day D released.

    The run's own file (same name, so the state's offsets apply) holds day D's first half only
    until the kill: the daemon cannot have closed the day before it (no event past D yet), so
    the kill always lands inside the day, however fast the machine reads."""
    run_events = work / name / "input" / events.name
    cfg, releases, port = _fresh(work, prepared, name, run_events)
    run_events.parent.mkdir()
    _copy_bytes(events, run_events, 0, half_day)
    proc = _start(cfg)
    try:
        t_start = time.perf_counter()
        while _records_read(port) < n // 2:
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited {proc.returncode} before the kill")
            if time.perf_counter() - t_start > TIMEOUT_S:
                raise TimeoutError("day D not half read")
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        _stop(proc)
    assert not _released(releases, DAY)
    _copy_bytes(events, run_events, half_day, None)
    t_restart = time.perf_counter()
    again = _start(cfg)
    try:
        return _wait_released(again, releases, t_restart)
    finally:
        _stop(again)


def run(quick: bool = False) -> list[dict[str, object]]:
    n = 20_000 if quick else 1_000_000
    runs = 1 if quick else 5
    assert dt.date.fromisoformat(DAY) < dt.date.today()
    base_runs, rec_runs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        events, prepared, half_day = _prepare(work, n)
        for r in range(runs):  # paired, the order alternating
            if r % 2:
                rec_runs.append(recovery(work, prepared, events, f"recovery-{r}", half_day, n))
            base_runs.append(uninterrupted(work, prepared, events, f"base-{r}"))
            if r % 2 == 0:
                rec_runs.append(recovery(work, prepared, events, f"recovery-{r}", half_day, n))
    value, base = statistics.median(rec_runs), statistics.median(base_runs)
    ratio = statistics.median(v / b for v, b in zip(rec_runs, base_runs, strict=True))
    return [
        entry(
            "recovery_seconds",
            value=round(value, 2),
            unit="s",
            baseline="uninterrupted run of the same day (process start → day released)",
            baseline_value=round(base, 2),
            ratio=round(ratio, 2),
            ratio_definition="median over paired runs of value ÷ baseline; lower is better",
            runs=runs,
            size=f"{n:,}-event day, {n // 4:,} users",
            detail=(
                f"file source, follow mode, a real `streamfilter run` process; SIGKILL once "
                f"{n // 2:,} of the day's {n:,} events were read (the rest arrives while it is "
                f"down), restart, until the day's {len(QUERIES)} releases are in the sink; the state "
                f"already holds a closed day of {n // 4:,} users. Recovery = start-up + "
                f"re-reading the open day from its first offset (only closed days are durable)"
            ),
        )
    ]


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    print(json.dumps(run(quick="--quick" in sys.argv), indent=2))
