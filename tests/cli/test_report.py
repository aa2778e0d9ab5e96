"""``streamfilter report``: a self-contained HTML page, checked as text and rendered in headless
Chromium (Debian package ``chromium``; skipped locally when missing, failed when ``CI=true``)."""

import json
import re
import shutil
import sqlite3
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest

from streamfilter.cli.budget import budget_stats
from streamfilter.cli.main import main
from streamfilter.cli.report import load_report_data, render_report, write_report
from streamfilter.config import load_config
from streamfilter.runtime.app import build_daemon
from streamfilter.runtime.store import SQLiteStateReader, SQLiteStateStore, StoreError
from streamfilter.runtime.store import reader as reader_module
from tests.conftest import require

USERS = [f"uid-REPORT-{i:03d}-secret" for i in range(40)]
DAYS = [f"2026-02-{d:02d}" for d in range(1, 15)]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A finished run: 14 days, a standing sum, a standing histogram, a one-day query, a query
    that starts late, some malformed input; the private active-set estimate on (users exhaust
    B_norm = 12 around day 9), and one ``budget-stats`` call afterwards."""
    d = tmp_path_factory.mktemp("report")
    lines = []
    for k, day in enumerate(DAYS):
        for i, user in enumerate(USERS):
            if (i + k) % 3:
                plan = ["free", "pro", "team"][i % 3]
                lines.append(
                    json.dumps({"user_id": user, "day": day, "values": {"active": 1, "plan": plan}})
                )
    lines += ["{oops", json.dumps({"user_id": USERS[0], "day": "2026-02-30", "values": {}})]
    lines += [json.dumps({"user_id": USERS[1], "day": DAYS[3], "values": {"x": "y"}, "z": 1})]
    (d / "events.jsonl").write_text("\n".join(lines) + "\n")
    queries = [
        {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0},
        {
            "query_id": "plans",
            "kind": "histogram",
            "feature": "plan",
            "categories": ["free", "pro", "team"],
            "clip": 1.0,
        },
    ]
    q = [json.dumps({**x, "from_day": DAYS[0]}) for x in queries]
    q.append(
        json.dumps(
            {
                "query_id": "focus-pro",
                "kind": "linear",
                "weights": {"plan=pro": [1.0]},
                "labels": ["plan=pro"],
                "clip": 1.0,
                "from_day": DAYS[5],
                "until_day": DAYS[5],
            }
        )
    )
    q.append(
        json.dumps(
            {
                "query_id": "late-start",
                "kind": "sum",
                "features": ["active"],
                "clip": 0.5,
                "from_day": DAYS[8],
            }
        )
    )
    (d / "queries.jsonl").write_text("\n".join(q) + "\n")
    (d / "streamfilter.toml").write_text(
        '[privacy]\nb_norm = 12.0\nrho = 2.0\ndelta = 1e-6\n[source]\nkind = "file"\n'
        'path = "events.jsonl"\n[queries]\nkind = "file"\npath = "queries.jsonl"\n'
        '[sink]\nkind = "file"\npath = "releases.jsonl"\n[state]\npath = "state.db"\n'
        "[telemetry]\nactive_set = true\nactive_set_horizon = 64\n"
    )
    parts = build_daemon(load_config(d / "streamfilter.toml"), follow=False)
    try:
        parts.daemon.run(until_end=True)
    finally:
        parts.close()
    budget_stats(load_config(d / "streamfilter.toml"))  # noisy, charged to the telemetry budget
    return d


def test_report_shows_releases_guarantee_telemetry_and_rejects(run_dir):
    settings = load_config(run_dir / "streamfilter.toml")
    data = load_report_data(settings)
    assert data.days == DAYS
    page = render_report(settings, data)
    # one plot per query with several releases (3) and its coverage beside it (3), one for the
    # single-release queries, one for the active-set estimate; the spent-fraction columns and
    # the rejects bar chart
    assert page.count('<svg class="plot"') == 8
    assert page.count('<svg class="plot columns"') == 1
    assert page.count('<svg class="plot bars"') == 1
    assert 'id="q-active"' in page and 'id="q-plans"' in page and 'id="q-late-start"' in page
    assert 'id="single-release"' in page and "focus-pro" in page
    assert page.count('class="band"') >= 3
    # the guarantee, from PrivacyParams.guarantee()
    g = settings.privacy_params().guarantee()
    assert f"{g.rho:g}-zCDP" in page
    assert f"{g.epsilon:.6g}" in page and f"{g.delta:g}" in page
    for method in g.epsilon_by_method:
        assert f"<td>{method}</td>" in page
    # telemetry: the noisy active-set estimate and the noisy budget statistics, in their own
    # section (never as a query), with the telemetry budget they spent
    assert 'id="q-_active_set"' not in page
    telemetry = page[page.index('id="telemetry"') : page.index('id="rejects"')]
    assert "noisy cumulative departures from the active set" in telemetry
    assert "Private budget statistics" in telemetry and "1 call(s)" in telemetry
    assert '<svg class="plot columns"' in telemetry
    assert "No noisy budget-exhaustion telemetry" not in page
    charged = (
        settings.telemetry.active_set_rho
        + settings.telemetry.stats_rho
        + settings.telemetry.coverage_rho  # coverage with every release, on by default
    )
    assert data.telemetry_rho_charged == pytest.approx(charged)
    assert "ρ<sub>tel</sub>" in page  # the guarantee says how telemetry composes
    # rejects by reason, labelled as operator data
    assert "operator data" in page.lower()
    assert data.rejects == {"malformed_json": 1, "invalid_day": 1, "unknown_field": 1}
    for reason in data.rejects:
        assert reason in page


def test_report_is_self_contained_and_leaks_no_user_data(run_dir):
    page = render_report(load_config(run_dir / "streamfilter.toml"))
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page, re.I)
    assert not re.search(r"@import|url\(", page)
    # the only URL is the SVG namespace (an identifier, never fetched)
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    # the reject file holds raw input (user ids): the page shows only reason counts
    rejects = (run_dir / "rejects.jsonl").read_text()
    assert USERS[0] in rejects
    assert "uid-REPORT" not in page


def test_report_never_reads_per_user_budgets(run_dir, monkeypatch):
    """Every statement SQLite runs for the report, traced on the reader's own connection."""
    queries: list[str] = []
    real_connect = sqlite3.connect

    def traced(*args, **kwargs):
        con = real_connect(*args, **kwargs)
        con.set_trace_callback(queries.append)
        return con

    monkeypatch.setattr(reader_module.sqlite3, "connect", traced)
    render_report(load_config(run_dir / "streamfilter.toml"))
    private = ("budgets", "budget_log", "active_set_state")
    assert any("FROM releases" in q for q in queries) or any("FROM days" in q for q in queries)
    assert not [q for q in queries if any(name in q for name in private)]


@pytest.mark.parametrize(
    ("table", "change", "where"),
    [
        ("meta", "value = value || '0'", "key = 'last_closed_day'"),
        ("days", "day = day || '0'", "1"),
        ("telemetry_ledger", "rho = rho * 2", "1"),
    ],
)
def test_report_refuses_a_row_that_does_not_match_its_checksum(
    run_dir, tmp_path, table, change, where
):
    """The report reads through the store's reader, which checks every row it returns — a
    value changed behind the store's back is refused, never plotted."""
    run_dir = Path(shutil.copytree(run_dir, tmp_path / "copy"))
    settings = load_config(run_dir / "streamfilter.toml")
    if table == "telemetry_ledger":  # the run's charges (active set, coverage, budget-stats)
        with SQLiteStateReader(run_dir / "state.db") as reader:
            assert len(reader.telemetry_ledger()) == 3
    con = sqlite3.connect(run_dir / "state.db")
    try:
        changed = con.execute(f"UPDATE {table} SET {change} WHERE {where}").rowcount
        con.commit()
    finally:
        con.close()
    assert changed >= 1
    with pytest.raises(StoreError, match=f"table {table} does not match its checksum"):
        if table == "meta":
            SQLiteStateReader(run_dir / "state.db").last_closed_day()
        else:
            load_report_data(settings)


def test_report_reads_the_state_while_the_daemon_holds_it(run_dir, tmp_path):
    store = SQLiteStateStore(run_dir / "state.db")  # the writer's lock is held
    try:
        out = write_report(load_config(run_dir / "streamfilter.toml"), tmp_path / "r.html")
    finally:
        store.close()
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_report_subcommand_writes_the_page(run_dir, tmp_path, capsys):
    out = tmp_path / "sub" / "report.html"
    code = main(["report", "--config", str(run_dir / "streamfilter.toml"), "--out", str(out)])
    assert code == 0
    assert out.exists() and "<svg" in out.read_text()
    assert str(out) in capsys.readouterr().err


def test_report_without_any_release_yet(tmp_path):
    (tmp_path / "sf.toml").write_text(
        '[privacy]\nb_norm = 4.0\nrho = 0.5\n[source]\nkind = "file"\npath = "e.jsonl"\n'
        '[sink]\nkind = "file"\npath = "releases.jsonl"\n[state]\npath = "state.db"\n'
    )
    page = render_report(load_config(tmp_path / "sf.toml"))
    assert "No release has been published yet" in page
    assert "No noisy budget-exhaustion telemetry has been released" in page
    assert "No input was rejected" in page


# ---------------------------------------------------------------------------- Chromium
def decode_png(data: bytes) -> np.ndarray:
    """A tiny PNG decoder (8-bit RGB/RGBA, not interlaced): height × width × channels."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, []
    width = height = bpp = 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
            bpp = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8)
    raw = raw.reshape(height, 1 + width * bpp)
    out = np.zeros((height, width * bpp), np.int32)
    prev = np.zeros(width * bpp, np.int32)
    for y in range(height):
        kind, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        if kind == 0:  # None
            cur = line
        elif kind == 1:  # Sub: running sum per channel
            cur = line.reshape(-1, bpp).cumsum(axis=0).reshape(-1) % 256
        elif kind == 2:  # Up
            cur = (line + prev) % 256
        else:  # Average / Paeth: sequential along the row
            cur = np.zeros_like(line)
            for i in range(len(line)):
                a = int(cur[i - bpp]) if i >= bpp else 0
                b = int(prev[i])
                if kind == 3:
                    cur[i] = (line[i] + (a + b) // 2) % 256
                else:
                    c = int(prev[i - bpp]) if i >= bpp else 0
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    cur[i] = (
                        line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)
                    ) % 256
        out[y] = cur
        prev = cur
    return out.reshape(height, width, bpp).astype(np.uint8)


CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.mark.timeout(240)
def test_report_renders_in_headless_chromium(run_dir, tmp_path):
    chromium = shutil.which("chromium")
    require(
        chromium is not None,
        "chromium not found; install it with deploy/install-test-deps.sh (Debian package 'chromium')",
    )
    assert chromium is not None
    page = write_report(load_config(run_dir / "streamfilter.toml"), tmp_path / "report.html")
    url = page.resolve().as_uri()
    shot = tmp_path / "report.png"
    base = [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    out = subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1200,2000", url],
        capture_output=True,
        timeout=180,
    )
    assert out.returncode == 0 and shot.exists(), out.stderr.decode()[-2000:]
    img = decode_png(shot.read_bytes())
    assert img.shape[:2] == (2000, 1200)
    rgb = img[:, :, :3].reshape(-1, 3)
    colours, counts = np.unique(rgb, axis=0, return_counts=True)
    # white cards (~40%) on the page background #f3f4f7 (~15%), the plot areas #fbfbfd; the
    # shares of the last two move with the noisy data (bands cover the plot areas)
    share = {tuple(int(v) for v in c): n / len(rgb) for c, n in zip(colours, counts, strict=True)}
    assert share[(255, 255, 255)] > 0.25
    assert share[(243, 244, 247)] > 0.05
    assert share.get((251, 251, 253), 0) > 0.03
    assert len(colours) > 200
    assert float(rgb.std()) > 10
    # the plot colours of the series are on screen (blue of series 1, red of series 2)
    for colour in ((31, 119, 180), (214, 39, 40)):
        assert (np.abs(rgb.astype(int) - colour).sum(axis=1) <= 6).sum() > 200, colour
    # after rendering, the DOM still holds the SVG plots with their bands and series
    dom = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, timeout=180, text=True
    ).stdout
    # 4 release plots, 3 coverage plots, active set, spent fractions, rejects
    assert dom.count("<svg") == 10
    assert dom.count('class="band"') >= 3 and dom.count('class="series"') >= 5
    Path(tmp_path / "screenshot-path.txt").write_text(str(shot))


def _population_releases(n_days: int = 10) -> tuple[list[str], list]:
    """A flat population of 1000 whose release falls to 40% of it by the last day."""
    from streamfilter.engine.contract import Coverage, Population, Release

    days = [f"2026-06-{d:02d}" for d in range(1, n_days + 1)]
    out = []
    for k, day in enumerate(days):
        value = 1000.0 - 60.0 * k
        pop = Population([1000.0 + (-1) ** k * 10], 12.0, [5.0], [30.0], "a user who has left ...")
        cov = Coverage(900 - 10 * k, 5.0, 10.0, 0.9 - 0.01 * k, 1000, 1.0)
        out.append(
            Release(
                day,
                "engaged",
                ["engaged"],
                [value],
                2.0,
                [4.0],
                "discrete_gaussian",
                1.0,
                coverage=cov,
                population=pop,
            )
        )
    return days, out


def test_the_report_plots_population_and_shades_by_value_coverage(tmp_path):
    from streamfilter.cli.report import ReportData

    cfg = tmp_path / "c.toml"
    cfg.write_text('[privacy]\nb_norm = 16.0\nrho = 0.5\n[queries]\nkind = "none"\n')
    days, releases = _population_releases()
    page = render_report(load_config(cfg), ReportData(releases, days, "test"))
    section = page[page.index('id="q-engaged"') : page.index('id="telemetry"')]
    assert "engaged — population" in section and "Population on 2026-06-10" in section
    # head-count coverage stays above 0.8 (never shaded by it); the VALUE coverage
    # (released ÷ population) falls below 0.5 from day 10 - 1000·0.5/60 ≈ day 9.3 on
    value_low = [d for d, r in zip(days, releases, strict=True) if r.value[0] / 1000.0 < 0.5]
    assert section.count('class="low-coverage"') == 2 * len(value_low) == 2 * 1
    assert "below 0.5 of the population estimate are shaded" in section


def test_value_axes_start_at_zero_and_an_oversized_clip_says_which_users_it_answers(tmp_path):
    """Clip 50 under B_norm 16: nobody affords a full contribution, but vectors of norm ≤ 4 are
    still answered — the report says so and never calls the series noise only."""
    from streamfilter.cli.report import ReportData
    from streamfilter.engine.contract import Coverage, Release

    cfg = tmp_path / "c.toml"
    cfg.write_text('[privacy]\nb_norm = 16.0\nrho = 0.5\n[queries]\nkind = "none"\n')
    days = ["2026-06-01", "2026-06-02", "2026-06-03"]
    releases = [
        Release(
            d,
            "wide",
            ["wide"],
            [v],
            2.0,
            [7.8],
            "discrete_gaussian",
            1.0,
            coverage=Coverage(0, 0.0, 0.0, 0.0, 100, None),
        )
        for d, v in zip(days, (354.6, 330.0, 341.0), strict=True)
    ]
    page = render_report(load_config(cfg), ReportData(releases, days, "test"))
    section = page[page.index('id="q-wide"') : page.index('id="telemetry"')]
    assert "noise only" not in section.lower()
    assert "answers users with ‖x‖ ≤ 4" in section and "Answers users with ‖x‖ ≤ 4" in section
    svg = section[section.index("<svg") : section.index("</svg>")]
    ticks = [t for t in re.findall(r'class="tick">([^<]+)</text>', svg) if "-" not in t[1:]]
    assert ticks[0] == "0", ticks  # the value axis starts at zero, not near 330
