"""Operable by default.

``run`` serves ``/metrics``, ``/healthz``, ``/readyz`` unless told not to; INFO logs at start-up
(no secrets), per day close and at shutdown; ``-v``/``--log-level``/``--log-format json`` on every
subcommand; the release and state gauges are restored from the state at start-up.
"""

import json
import os
import socket
import subprocess
import sys
import urllib.request

import pytest

from streamfilter.cli.main import build_parser
from streamfilter.config import load_config
from streamfilter.engine import ingest
from streamfilter.errors import ConfigError
from streamfilter.runtime.app import build_daemon
from tests.support.cli import CONFIG, cli, write_world


def _with(tmp_path, extra: str) -> None:
    (tmp_path / "streamfilter.toml").write_text(CONFIG + extra)


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.status, resp.read().decode()


def test_metrics_are_served_by_default_and_gauges_restored_after_a_restart(tmp_path):
    write_world(tmp_path)
    _with(tmp_path, "[metrics]\nport = 0\n")  # no `enabled`: the default serves
    settings = load_config(tmp_path / "streamfilter.toml")
    assert settings.metrics.enabled
    parts = build_daemon(settings, follow=False, allow_test_seed=True)
    try:
        assert parts.metrics is not None
        url = parts.metrics.server.url
        parts.daemon.run(until_end=True)
        assert _get(url + "/healthz")[0] == 200
        assert "streamfilter_release_value" in _get(url + "/metrics")[1]
    finally:
        parts.close()
    parts = build_daemon(load_config(tmp_path / "streamfilter.toml"), allow_test_seed=True)
    try:  # restarted, nothing closed yet: the gauges describe the stored state
        assert parts.metrics is not None
        reg = parts.metrics.registry
        value = reg.get_sample_value(
            "streamfilter_release_value", {"query_id": "active", "coordinate": "active"}
        )
        assert value is not None
        assert reg.get_sample_value("streamfilter_state_store_size_bytes") > 0
        assert reg.get_sample_value("streamfilter_last_closed_day_timestamp_seconds") > 0
    finally:
        parts.close()


def test_a_taken_port_warns_by_default_and_refuses_when_enabled_explicitly(tmp_path, caplog):
    write_world(tmp_path)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        _with(tmp_path, f"[metrics]\nport = {port}\n")
        parts = build_daemon(load_config(tmp_path / "streamfilter.toml"), allow_test_seed=True)
        parts.close()
        assert parts.metrics is None and "cannot listen" in caplog.text
        _with(tmp_path, f"[metrics]\nenabled = true\nport = {port}\n")
        with pytest.raises(ConfigError, match=r"metrics\.port"):
            build_daemon(load_config(tmp_path / "streamfilter.toml"), allow_test_seed=True)


def test_run_logs_start_up_each_close_and_shutdown_without_secrets(tmp_path):
    write_world(tmp_path)
    _with(
        tmp_path,
        '[metrics]\nenabled = false\n[kafka]\nsasl_plain_password = "hunter2-secret"\n',
    )
    proc = cli("run", "--config", "streamfilter.toml", "--until-end", "--testing", cwd=tmp_path)
    err = proc.stderr
    assert "INFO streamfilter.run: starting: source file" in err
    assert "B_norm = 3" in err and "metrics off" in err
    assert f"; event scanner {ingest.SCANNER}" in err
    assert err.count("INFO streamfilter.daemon: closed day") == 5
    assert "INFO streamfilter.daemon: stopped: 5 days closed, 9 releases published" in err
    assert "hunter2" not in err


def test_logging_options_on_every_subcommand_and_json_format(tmp_path):
    write_world(tmp_path)
    _with(tmp_path, "[metrics]\nenabled = false\n")
    parser = build_parser()
    for argv in (
        ["run", "--config", "c", "-v"],
        ["-v", "run", "--config", "c"],
        ["guarantee", "--config", "c", "--log-level", "debug"],
        ["topics", "create", "--config", "c", "--log-format", "json"],
        ["budget", "--config", "c", "--user", "u", "-v"],
        ["report", "--config", "c", "--log-level", "WARNING"],
        ["demo", "-v"],
    ):
        args = parser.parse_args(argv)
        assert args.verbose or args.log_level or args.log_format == "json"
    args = parser.parse_args(["--log-level", "ERROR", "run", "--config", "c"])
    assert args.log_level == "ERROR"  # not overwritten by the subcommand's default
    proc = cli(
        "run", "--config", "streamfilter.toml", "--until-end", "--testing", "--log-format",
        "json", cwd=tmp_path,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    logs = [json.loads(x) for x in lines[:-1]]
    assert {"time", "level", "logger", "message"} <= set(logs[0])
    assert any(x["message"].startswith("closed day") for x in logs)
    assert "summary" in json.loads(lines[-1])


def test_every_cli_option_has_help_text():
    parser = build_parser()
    from streamfilter.cli.main import _subparsers

    for p in [parser, *_subparsers(parser)]:
        for action in p._actions:
            if action.option_strings:
                assert action.help, f"{p.prog} {action.option_strings} has no help text"


@pytest.mark.parametrize("impl", ["python", "unbuilt"])
def test_a_run_without_the_native_helpers_releases_the_same(tmp_path, impl):
    """The whole run on the pure-Python paths — chosen (``STREAMFILTER_IMPL=python``) or with
    the extensions unimportable, as on a machine without a compiler, where the daemon says so
    at start and names them — releases exactly what the native run releases."""
    releases = {}
    for native in (True, False):
        run_dir = tmp_path / ("native" if native else "python")
        run_dir.mkdir()
        write_world(run_dir)
        _with(run_dir, "[metrics]\nenabled = false\n")
        env = {**os.environ, "STREAMFILTER_IMPL": "native"}
        hide = ""
        if not native and impl == "python":
            env["STREAMFILTER_IMPL"] = "python"
        elif not native:
            env.pop("STREAMFILTER_IMPL")
            hide = "sys.modules.update(dict.fromkeys(NATIVE, None))\n"
        code = (
            "import sys\n"
            "from streamfilter._native import EXTENSIONS\n"
            "NATIVE = [f'streamfilter.{m}' for m in EXTENSIONS]\n"
            f"{hide}from streamfilter.cli.main import main\n"
            "sys.exit(main(['run', '--config', 'streamfilter.toml', '--until-end', '--testing']))\n"
        )
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=run_dir,
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert proc.returncode == 0, proc.stderr
        warned = "WARNING streamfilter.run: native helpers not built (engine/_jsonl.c, "
        assert (warned in proc.stderr) == (not native and impl == "unbuilt")
        assert ("STREAMFILTER_IMPL=python" in proc.stderr) == (not native and impl == "python")
        assert ("event scanner python" in proc.stderr) is not native
        releases[native] = (run_dir / "out" / "releases.jsonl").read_text()
    assert releases[True] == releases[False] and releases[True]


@pytest.mark.parametrize("mechanism", ["gaussian", "discrete_gaussian"])
@pytest.mark.parametrize("events", [False, True], ids=["start", "whole-run"])
def test_a_run_imports_no_scipy(tmp_path, mechanism, events):
    """A run starts (its start-up line logged), closes its days with their error
    bars and coverage intervals, and ends without importing scipy (~0.4 s of imports at start,
    0.2 s more at the first close): the released half-widths use ``privacy.normal`` and
    ``privacy.continual.fft_convolve`` (numpy), the start-up line states ρ without the (ε, δ)
    root finder."""
    write_world(tmp_path)
    if not events:
        (tmp_path / "events.jsonl").write_text("")
    _with(tmp_path, "[metrics]\nenabled = false\n")
    config = (tmp_path / "streamfilter.toml").read_text()
    (tmp_path / "streamfilter.toml").write_text(
        config.replace('exhaustion = "skip"', f'exhaustion = "skip"\nmechanism = "{mechanism}"')
    )
    code = (
        "import atexit, json, sys\n"
        "atexit.register(lambda: print(json.dumps(sorted(m for m in sys.modules"
        " if m.split('.')[0] == 'scipy'))))\n"
        "from streamfilter.cli.main import main\n"
        "sys.exit(main(['run', '--config', 'streamfilter.toml', '--until-end', '--testing']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "INFO streamfilter.run: starting:" in proc.stderr
    assert f"{mechanism} σ = " in proc.stderr
    assert "freed memory is kept for reuse while records flow" in proc.stderr
    assert ("INFO streamfilter.daemon: closed day 2026-01-05" in proc.stderr) is events
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []
