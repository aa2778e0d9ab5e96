"""deploy/: everything that can be validated on this machine.

* promtool: ``check config``, ``check rules``, ``test rules`` (the alerts fire when they should),
  ``check metrics`` on a live scrape of a running daemon;
* every YAML manifest and the Grafana dashboard parse; every metric they use is one the daemon
  exports by default (never an ``_exact`` one);
* the compose file, the Kubernetes ConfigMap and the example TOML only use configuration keys the
  daemon accepts (``load_config``), and ports / paths agree across the files;
* end to end: the real Prometheus server scrapes ``streamfilter run`` (follow mode) on loopback
  and a streamfilter metric is read back through ``/api/v1/query``; every dashboard and alert
  expression is accepted by that server's query engine.

promtool / prometheus come from the Debian package ``prometheus``
(``deploy/install-test-deps.sh``): skipped locally when missing, failed when ``CI=true``.
"""

import configparser
import datetime as dt
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from streamfilter.config import load_config
from streamfilter.engine.params import PrivacyParams
from streamfilter.errors import RESTART_CANNOT_HELP
from streamfilter.runtime.app import build_daemon
from streamfilter.runtime.observe.prometheus import EXACT_METRICS, PrometheusObserver
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
PROM_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "streamfilter.json"
COMPOSE = DEPLOY / "docker-compose.yml"
K8S = DEPLOY / "k8s"
EXAMPLE_TOML = DEPLOY / "streamfilter.toml"
STREAMFILTER_BIN = Path(sys.executable).parent / "streamfilter"
INSTALL_HINT = "install it with deploy/install-test-deps.sh (Debian package 'prometheus')"


def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, f"promtool not found; {INSTALL_HINT}")
    assert path is not None
    return path


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def exported_metric_names() -> set[str]:
    """Every sample name the daemon exports by default (histograms with their suffixes)."""
    reg = CollectorRegistry()
    obs = PrometheusObserver(reg, PrivacyParams.create(b_norm=4.0, rho=0.5))
    obs.records_read("p", 1)
    obs.partition_lag("p", 1)
    obs.partitions_owned(1)  # registered by cluster workers
    families = list(reg.collect())  # labelled gauges without children have no samples yet
    return {m.name for m in families} | {s.name for m in families for s in m.samples}


def manifest_files() -> list[Path]:
    files = [p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml")]
    return sorted(p for p in files if "kafka" not in p.relative_to(DEPLOY).parts)


# ---------------------------------------------------------------------------- promtool
def test_promtool_checks_the_scrape_config_and_the_alert_rules():
    tool = promtool()
    out = run([tool, "check", "config", str(PROM_DIR / "prometheus.yml")])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr
    out = run([tool, "check", "rules", str(PROM_DIR / "alerts.yml")])
    assert out.returncode == 0, out.stdout + out.stderr
    shipped = len(_exprs_of_alerts())
    assert shipped >= 13
    assert f"SUCCESS: {shipped} rules found" in out.stdout + out.stderr


def test_promtool_unit_tests_of_the_alerts_pass():
    """Day not closed on time, fail-closed, down, reject spike and consumer lag fire as written."""
    out = run([promtool(), "test", "rules", "alerts_test.yml"], cwd=PROM_DIR)
    assert out.returncode == 0, out.stdout + out.stderr


def _daemon_config(tmp_path: Path, port: int, *, follow: bool) -> Path:
    today = dt.datetime.now(dt.UTC).date()
    days = [(today - dt.timedelta(days=k)).isoformat() for k in (4, 3, 2)]
    events = [
        {"user_id": f"u{i}", "day": day, "values": {"active": 1, "plan": ["free", "pro"][i % 2]}}
        for day in days
        for i in range(5)
    ]
    lines = [json.dumps(e) for e in events] + ["not json"]
    (tmp_path / "events.jsonl").write_text("\n".join(lines) + "\n")
    queries = [
        {"query_id": "active", "kind": "sum", "features": ["active"], "clip": 1.0},
        {
            "query_id": "plans",
            "kind": "histogram",
            "feature": "plan",
            "categories": ["free", "pro"],
            "clip": 1.0,
        },
    ]
    (tmp_path / "queries.jsonl").write_text(
        "".join(json.dumps({**q, "from_day": days[0]}) + "\n" for q in queries)
    )
    cfg = tmp_path / "streamfilter.toml"
    window = '[window]\nallowed_lateness = "0s"\nidle_timeout = "1s"\npoll_interval = "0.2s"\n'
    cfg.write_text(
        "[privacy]\nb_norm = 4.0\nrho = 0.5\ndelta = 1e-6\n"
        + (window if follow else "")
        + '[source]\nkind = "file"\npath = "events.jsonl"\n'
        '[queries]\nkind = "file"\npath = "queries.jsonl"\n'
        '[sink]\nkind = "file"\npath = "releases.jsonl"\n[state]\npath = "state.db"\n'
        f'[metrics]\nenabled = true\nhost = "127.0.0.1"\nport = {port}\n'
    )
    return cfg


def test_promtool_check_metrics_on_a_live_scrape(tmp_path):
    tool = promtool()
    parts = build_daemon(load_config(_daemon_config(tmp_path, 0, follow=False)), follow=False)
    try:
        parts.daemon.run(until_end=True)
        with urllib.request.urlopen(parts.metrics.server.url + "/metrics", timeout=5) as resp:
            body = resp.read()
    finally:
        parts.close()
    assert b"streamfilter_day_closes_total 3.0" in body
    out = subprocess.run([tool, "check", "metrics"], input=body, capture_output=True, timeout=60)
    # promtool prints one line per lint problem (naming, units, help text); none is allowed
    assert out.returncode == 0, (out.stdout + out.stderr).decode()
    assert (out.stdout + out.stderr).strip() == b""


# ---------------------------------------------------------------------------- parsing
def test_every_manifest_and_the_dashboard_parse():
    files = manifest_files()
    names = {p.relative_to(DEPLOY).as_posix() for p in files}
    assert {
        "docker-compose.yml",
        "prometheus/prometheus.yml",
        "prometheus/alerts.yml",
        "prometheus/alerts_test.yml",
        "k8s/configmap.yaml",
        "k8s/networkpolicy.yaml",
        "k8s/service.yaml",
        "k8s/statefulset.yaml",
        "k8s/kustomization.yaml",
        "grafana/provisioning/datasources/prometheus.yml",
        "grafana/provisioning/dashboards/streamfilter.yml",
    } <= names
    for path in files:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs, path
    for path in K8S.glob("*.yaml"):
        (doc,) = yaml.safe_load_all(path.read_text())
        assert doc["apiVersion"] and doc["kind"], path
        if doc["kind"] != "Kustomization":
            assert doc["metadata"]["name"], path
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "streamfilter" and dash["panels"]


def _exprs_of_dashboard() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = []
    for panel in dash["panels"]:
        exprs += [t["expr"] for t in panel.get("targets", [])]
    return exprs


def _exprs_of_alerts() -> list[str]:
    rules = yaml.safe_load((PROM_DIR / "alerts.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def test_dashboard_and_alerts_use_only_metrics_exported_by_default():
    exported = exported_metric_names()
    used = set()
    for expr in _exprs_of_dashboard() + _exprs_of_alerts():
        used |= set(re.findall(r"\bstreamfilter_[a-z0-9_]+", expr))
    assert used
    assert used <= exported, used - exported
    assert not [n for n in used if n in EXACT_METRICS or "exact" in n]
    dash = json.loads(DASHBOARD.read_text())
    titles = " ".join(p["title"] for p in dash["panels"])
    for needle in ("95%", "lag", "Rejects", "Day-close", "ρ", "ε", "σ"):
        assert needle in titles, needle
    band = [p for p in dash["panels"] if p.get("repeat") == "query_id"]
    assert band and any("streamfilter_release_ci95" in t["expr"] for t in band[0]["targets"])


# ---------------------------------------------------------------------------- config keys
def _compose():
    return yaml.safe_load(COMPOSE.read_text())


def _configmap_toml(tmp_path: Path) -> Path:
    cm = yaml.safe_load((K8S / "configmap.yaml").read_text())
    path = tmp_path / "configmap-streamfilter.toml"
    path.write_text(cm["data"]["streamfilter.toml"])
    return path


def test_example_toml_is_a_valid_configuration():
    s = load_config(EXAMPLE_TOML)
    assert s.metrics.enabled and s.metrics.port == 9464
    assert not s.metrics.trusted_operator_metrics
    assert s.state.path == Path("/var/lib/streamfilter/state.db")


def test_configmap_uses_only_keys_the_daemon_accepts(tmp_path):
    s = load_config(_configmap_toml(tmp_path))
    assert s.source.kind == s.queries.kind == s.sink.kind == s.rejects.kind == "kafka"
    assert s.metrics.enabled and s.metrics.host == "0.0.0.0"
    assert not s.metrics.trusted_operator_metrics
    sts = yaml.safe_load((K8S / "statefulset.yaml").read_text())
    svc = yaml.safe_load((K8S / "service.yaml").read_text())
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert sts["spec"]["replicas"] == 1  # one writer per state
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["metrics"] == s.metrics.port == svc["spec"]["ports"][0]["port"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert s.state.path.parent == Path(mounts["state"])
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["state"]
    cfg_arg = container["args"][container["args"].index("--config") + 1]
    assert Path(cfg_arg).parent == Path(mounts["config"])
    cm = yaml.safe_load((K8S / "configmap.yaml").read_text())
    assert pod["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]


def test_compose_environment_uses_only_keys_the_daemon_accepts(monkeypatch):
    compose = _compose()
    services = compose["services"]
    assert {"kafka", "streamfilter", "prometheus", "grafana"} <= set(services)
    sf = services["streamfilter"]
    env = sf["environment"]
    for key, value in env.items():
        assert key.startswith("STREAMFILTER_"), key
        monkeypatch.setenv(key, str(value))
    mounted = {v.split(":")[1]: v.split(":")[0] for v in sf["volumes"] if v.startswith("./")}
    toml = DEPLOY / mounted["/etc/streamfilter/streamfilter.toml"]
    assert toml == EXAMPLE_TOML
    s = load_config(toml)  # raises ConfigError naming any key the daemon does not accept
    assert s.source.kind == "kafka" and s.source.topic == "streamfilter.events"
    assert s.sink.kind == "kafka" and s.kafka.bootstrap_servers == "kafka:9092"
    assert s.metrics.enabled and s.metrics.host == "0.0.0.0"
    # Prometheus scrapes the streamfilter service on the configured port
    prom = yaml.safe_load((PROM_DIR / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    (target,) = job["static_configs"][0]["targets"]
    assert target == f"streamfilter:{s.metrics.port}"
    assert job["job_name"] == "streamfilter"  # alerts.yml: up{job="streamfilter"}
    # every file the compose file mounts exists
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume.startswith("./"):
                assert (DEPLOY / volume.split(":")[0]).exists(), volume
    kraft = services["kafka"]["environment"]
    assert "controller" in kraft["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert services["streamfilter"]["command"][0] == "run"


CLUSTER = DEPLOY / "cluster"


def _cluster_settings(env: dict[str, str], monkeypatch):
    for key, value in env.items():
        if key.startswith("STREAMFILTER_") and "__" in key:
            monkeypatch.setenv(key, str(value))
    monkeypatch.setenv("STREAMFILTER_PG_PASSWORD", "not-a-secret")
    return load_config(CLUSTER / "cluster.toml")


def test_cluster_compose_runs_n_workers_of_one_configuration(monkeypatch):
    """deploy/cluster/docker-compose.yml: N replicas of the same `run --config
    cluster.toml` over Kafka + PostgreSQL; the worker role is created by postgres-init.sh; every
    replica is a Prometheus target under the job the alerts expect."""
    compose = yaml.safe_load((CLUSTER / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"kafka", "postgres", "topics", "worker", "prometheus"} <= set(services)
    worker = services["worker"]
    assert worker["deploy"]["replicas"] >= 2
    assert worker["command"] == ["run", "--config", "/etc/streamfilter/cluster.toml"]
    env = worker["environment"]
    assert env["STREAMFILTER_PG_PASSWORD"].startswith("${")  # from the operator's environment
    s = _cluster_settings(env, monkeypatch)
    assert s.cluster.enabled and s.source.kind == "kafka" and s.state.kind == "postgres"
    assert s.kafka.group_id and s.state.password_env == "STREAMFILTER_PG_PASSWORD"
    assert "@postgres:" in s.state.url and ":" not in s.state.url.split("//")[1].split("@")[0]
    assert s.metrics.enabled and s.metrics.host == "0.0.0.0"
    for service in services.values():
        for volume in service.get("volumes", []):
            if volume.startswith("./") or volume.startswith("../"):
                assert (CLUSTER / volume.split(":")[0]).exists(), volume
    init = {v.split(":")[1] for v in services["postgres"]["volumes"]}
    assert "/docker-entrypoint-initdb.d/worker-role.sql.in" in init
    prom = yaml.safe_load((CLUSTER / "prometheus.yml").read_text())
    (job,) = prom["scrape_configs"]
    assert job["job_name"] == "streamfilter"
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["worker"] and sd["port"] == s.metrics.port
    out = run([promtool(), "check", "config", "--syntax-only", str(CLUSTER / "prometheus.yml")])
    assert out.returncode == 0, out.stdout + out.stderr


def test_cluster_kubernetes_manifests_agree(monkeypatch):
    """deploy/cluster (kustomize): a Deployment of N workers with probes, the database password
    from a Secret, one scrape target per pod, a disruption budget and PostgreSQL initialised by
    the same role script."""
    kust = yaml.safe_load((CLUSTER / "kustomization.yaml").read_text())
    for res in kust["resources"]:
        assert (CLUSTER / res).exists(), res
    generated = {g["name"]: g["files"] for g in kust["configMapGenerator"]}
    for files in generated.values():
        for f in files:
            assert (CLUSTER / f.split("=")[-1]).exists(), f
    docs = {}
    for res in kust["resources"]:
        for doc in yaml.safe_load_all((CLUSTER / res).read_text()):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    deployment = docs[("Deployment", "streamfilter-worker")]
    assert deployment["spec"]["replicas"] >= 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env["STREAMFILTER_PG_PASSWORD"]  # from the Secret, never inline
    assert env["STREAMFILTER_PG_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    s = _cluster_settings({k: e["value"] for k, e in env.items() if "value" in e}, monkeypatch)
    assert s.cluster.enabled and "@streamfilter-postgres:" in s.state.url
    assert container["args"] == ["run", "--config", "/etc/streamfilter/cluster.toml"]
    assert pod["volumes"][0]["configMap"]["name"] in generated
    assert "cluster.toml" in generated[pod["volumes"][0]["configMap"]["name"]]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {p["containerPort"] for p in container["ports"]} == {s.metrics.port}
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    svc = docs[("Service", "streamfilter-worker")]
    pdb = docs[("PodDisruptionBudget", "streamfilter-worker")]
    for selector in (svc["spec"]["selector"], pdb["spec"]["selector"]["matchLabels"]):
        assert selector.items() <= labels.items()
    pg = docs[("StatefulSet", "streamfilter-postgres")]["spec"]["template"]["spec"]
    assert pg["volumes"][0]["configMap"]["name"] == "streamfilter-postgres-init"


def test_dockerfile_and_systemd_unit_agree_with_the_cli(tmp_path):
    docker = (DEPLOY / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (?!--from)(\S+)", docker, re.M):
        assert (ROOT / src).exists(), src
    assert re.search(r"^USER 10001", docker, re.M)  # not root
    assert re.search(r"^EXPOSE 9464$", docker, re.M)
    assert 'ENTRYPOINT ["streamfilter"]' in docker
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(DEPLOY / "systemd" / "streamfilter.service")
    exec_start = unit["Service"]["ExecStart"].split()
    assert exec_start[1:3] == ["run", "--config"]
    assert Path(exec_start[3]).parent.name == unit["Service"]["ConfigurationDirectory"]
    # exactly the exit codes a restart cannot change (an unreachable service is not one)
    prevent = {int(c) for c in unit["Service"]["RestartPreventExitStatus"].split()}
    assert prevent == set(RESTART_CANNOT_HELP)
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "systemd-analyze not found; deploy/install-test-deps.sh (systemd)")
    assert analyze is not None
    # verify with the ExecStart binary pointed at this checkout's CLI
    text = (DEPLOY / "systemd" / "streamfilter.service").read_text()
    local = tmp_path / "streamfilter.service"
    local.write_text(text.replace("/opt/streamfilter/bin/streamfilter", str(STREAMFILTER_BIN)))
    out = run([analyze, "verify", str(local)])
    assert out.returncode == 0 and out.stderr.strip() == "", out.stderr


#: the Kubernetes release whose OpenAPI schemas the manifests are validated against
K8S_VERSION = "1.37.0"


def _kustomize(directory: Path) -> list[dict]:
    """The documents ``kubectl apply -k directory`` would send: each listed resource, and one
    ConfigMap per ``configMapGenerator`` entry (``key=file`` or ``file``; every file exists)."""
    kust = yaml.safe_load((directory / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization" and set(kust) <= {
        "apiVersion",
        "kind",
        "resources",
        "configMapGenerator",
    }, sorted(kust)
    docs = [
        d for res in kust["resources"] for d in yaml.safe_load_all((directory / res).read_text())
    ]
    for gen in kust.get("configMapGenerator", []):
        data = {}
        for entry in gen["files"]:
            key, _, path = entry.rpartition("=")
            data[key or Path(path).name] = (directory / path).read_text()
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": gen["name"]},
                "data": data,
            }
        )
    return docs


@pytest.mark.parametrize("directory", [K8S, CLUSTER], ids=["k8s", "cluster"])
def test_the_kubernetes_manifests_validate_against_the_api_schemas(directory):
    """Every document of the kustomization, generated ConfigMaps included, against the
    Kubernetes OpenAPI schemas shipped in the kubernetes-validate package (strict: an unknown
    field fails, as ``kubectl apply --validate=strict`` would)."""
    import kubernetes_validate

    docs = _kustomize(directory)
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(set(names)) == len(names), names
    if directory == K8S:
        assert sorted(k for k, _ in names) == [
            "ConfigMap",
            "NetworkPolicy",
            "Service",
            "StatefulSet",
        ]
    with pytest.raises(kubernetes_validate.ValidationError, match="unexpected"):
        kubernetes_validate.validate({**docs[0], "bogus": 1}, K8S_VERSION, strict=True)


# ---------------------------------------------------------------------------- end to end
def _api(base: str, path: str, **params: str) -> dict:
    url = f"{base}{path}?{urllib.parse.urlencode(params)}" if params else f"{base}{path}"
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
            if last:
                return last
        except (OSError, ValueError, KeyError, IndexError) as exc:
            last = exc
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; last: {last!r}")


def _stop(proc: subprocess.Popen, timeout_s: float = 20) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
            raise
    return int(proc.returncode)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_real_prometheus_scrapes_a_running_daemon(tmp_path):
    tool = promtool()
    server = shutil.which("prometheus")
    require(server is not None, f"prometheus server not found; {INSTALL_HINT}")
    assert server is not None
    sf_port, prom_port = free_port(), free_port()
    cfg = _daemon_config(tmp_path, sf_port, follow=True)

    # 1. the daemon in follow mode (it never exits by itself)
    daemon_log = open(tmp_path / "daemon.log", "wb")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen(
        [str(STREAMFILTER_BIN), "-v", "run", "--config", str(cfg)],
        stdout=daemon_log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    prom = None
    prom_log = open(tmp_path / "prometheus.log", "wb")  # noqa: SIM115 - closed below
    try:
        sf = f"http://127.0.0.1:{sf_port}"

        def ready():
            with urllib.request.urlopen(sf + "/readyz", timeout=2) as resp:
                return resp.status == 200

        _wait(ready, 60, "streamfilter /readyz")

        # 2. Prometheus on loopback: 1 s scrapes, our alert rules loaded, temp storage
        prom_cfg = tmp_path / "prometheus.yml"
        prom_cfg.write_text(
            yaml.safe_dump(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(PROM_DIR / "alerts.yml")],
                    "scrape_configs": [
                        {
                            "job_name": "streamfilter",
                            "static_configs": [{"targets": [f"127.0.0.1:{sf_port}"]}],
                        }
                    ],
                }
            )
        )
        check = run([tool, "check", "config", str(prom_cfg)])
        assert check.returncode == 0, check.stdout + check.stderr
        prom = subprocess.Popen(
            [
                server,
                f"--config.file={prom_cfg}",
                f"--storage.tsdb.path={tmp_path / 'prom-data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--log.level=warn",
            ],
            stdout=prom_log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{prom_port}"

        # 3. read streamfilter metrics back through the query API
        def days_closed():
            out = _api(base, "/api/v1/query", query="streamfilter_day_closes_total")
            result = out["data"]["result"]
            return result and float(result[0]["value"][1]) == 3.0 and result

        (sample,) = _wait(days_closed, 90, "streamfilter_day_closes_total == 3 in Prometheus")
        print(f"Prometheus /api/v1/query streamfilter_day_closes_total -> {sample}")
        assert sample["metric"]["job"] == "streamfilter"
        assert sample["metric"]["instance"] == f"127.0.0.1:{sf_port}"
        out = _api(base, "/api/v1/query", query="streamfilter_privacy_rho")
        assert float(out["data"]["result"][0]["value"][1]) == 0.5
        out = _api(base, "/api/v1/query", query='up{job="streamfilter"}')
        assert out["data"]["result"][0]["value"][1] == "1"
        out = _api(
            base, "/api/v1/query", query='streamfilter_rejects_total{reason="malformed_json"}'
        )
        assert out["data"]["result"][0]["value"][1] == "1"
        out = _api(base, "/api/v1/query", query="streamfilter_release_value")
        assert {r["metric"]["query_id"] for r in out["data"]["result"]} == {"active", "plans"}

        # 4. every dashboard and alert expression is valid PromQL for this server
        for expr in _exprs_of_dashboard() + _exprs_of_alerts():
            q = expr.replace("$__rate_interval", "1m").replace("$query_id", "active")
            res = _api(base, "/api/v1/query", query=q)
            assert res["status"] == "success", (expr, res)

        # 5. the alert rules are loaded and evaluate without errors
        shipped = yaml.safe_load((PROM_DIR / "alerts.yml").read_text())["groups"]
        n_rules = sum(len(g["rules"]) for g in shipped)

        def rules_evaluated():
            groups = _api(base, "/api/v1/rules")["data"]["groups"]
            rules = [r for g in groups for r in g["rules"]]
            return len(rules) == n_rules and all(r["health"] != "unknown" for r in rules) and rules

        rules = _wait(rules_evaluated, 30, "alert rules evaluated")
        assert {r["health"] for r in rules} == {"ok"}, rules
    finally:
        code = _stop(daemon)
        if prom is not None:
            _stop(prom)
        daemon_log.close()
        prom_log.close()
    assert code == 0, (tmp_path / "daemon.log").read_text()  # SIGTERM drains and exits 0


def test_the_dashboard_shows_coverage_and_population_on_axes_that_include_zero():
    dash = json.loads(DASHBOARD.read_text())
    exprs = " ".join(_exprs_of_dashboard())
    for name in (
        "streamfilter_release_population",
        "streamfilter_release_coverage_users",
        "streamfilter_release_coverage_ci95",
        "streamfilter_privacy_guarantee_rho",
    ):
        assert name in exprs, name
    for panel in dash["panels"]:
        if panel["type"] == "timeseries":
            custom = panel["fieldConfig"]["defaults"]["custom"]
            assert custom.get("axisSoftMin") == 0, panel["title"]
    coverage = [p for p in dash["panels"] if p["title"] == "Coverage $query_id"]
    assert coverage and "popcount" in coverage[0]["description"]
