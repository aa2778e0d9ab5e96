"""Secured clusters: the daemon over SASL_SSL end to end, one clear
line and a fast exit for every TLS / SASL / ACL failure, and least privilege.

One secured broker for the session (``kafka_secured``: SASL_SSL, a CA made by kafka-up.sh,
SCRAM users ``admin`` and ``app``, ACLs enforced)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import pytest

from tests.conftest import require
from tests.runtime.io.test_kafka_daemon import (
    QUERIES,
    cli,
    config_text,
    make_events,
    reference,
    unique_topic,
)
from tests.support.kafka_broker import SASL_PASSWORDS, admin_client, read_topic

pytestmark = pytest.mark.kafka


def secured_config(topics, broker, user="admin", mechanism="SCRAM-SHA-512", **override) -> str:
    """test_kafka_daemon's Kafka configuration with the security settings of ``user``."""
    keys = {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": mechanism,
        "sasl_plain_username": user,
        "sasl_plain_password": SASL_PASSWORDS[user],
        "ssl_cafile": str(broker.tls_dir / "ca.crt"),
        **override,
    }
    text = config_text("kafka", topics, broker.bootstrap)
    if "bootstrap_servers" in override:
        text = text.replace(f'bootstrap_servers = "{broker.bootstrap}"\n', "")
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    # no /metrics: the default port 9464 may be held by a daemon of another test (another xdist
    # worker), and its warning would break the one-clear-line checks below
    metrics = "[metrics]\nenabled = false\n"
    return text.replace("[kafka]\n", "[kafka]\n" + lines) + metrics


def new_topics():
    return {k: unique_topic(k) for k in ("events", "queries", "releases", "rejects")}


def produce(broker, topics, events):
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", **broker.client())
    for q in QUERIES:
        producer.send(topics["queries"], value=json.dumps(q).encode())
    for ev in events:
        producer.send(topics["events"], value=ev)
    producer.flush()
    producer.close()


@pytest.mark.timeout(300)
def test_the_daemon_runs_end_to_end_over_sasl_ssl(kafka_secured, tmp_path):
    """topics create, run and a kcat reader over SASL_SSL (SCRAM-SHA-512); releases equal the
    file path's; the password appears nowhere in the output."""
    broker = kafka_secured
    events = make_events(days=3, users=120)
    expected = reference(tmp_path, events)
    work = tmp_path / "secured"
    work.mkdir()
    topics = new_topics()
    (work / "streamfilter.toml").write_text(secured_config(topics, broker))
    created = cli(["topics", "create", "--config", "streamfilter.toml"], cwd=work)
    assert created.stdout.count("created") == 4
    produce(broker, topics, events)
    proc = cli(["run", "--config", "streamfilter.toml", "--until-end", "--testing"], cwd=work)
    assert SASL_PASSWORDS["admin"] not in proc.stderr + proc.stdout
    got = {}
    for rec in read_topic(broker.bootstrap, topics["releases"], client=broker.client()):
        got.setdefault(rec.key.decode(), set()).add(rec.value)
    assert got == {f"{d}/{q}": {v} for (d, q), v in expected.items()}
    # docs/kafka.md: reading the releases with a non-Python client (kcat), committed records only
    require(shutil.which("kcat") is not None, "kcat (Debian package kcat) is not installed")
    # (PLAIN: Debian bookworm's kcat, librdkafka 2.0.2, fails SCRAM against Kafka 4.4)
    c = broker.client(mechanism="PLAIN")
    out = subprocess.run(
        [
            *("kcat", "-C", "-b", broker.bootstrap, "-t", topics["releases"], "-e", "-q"),
            *("-X", "isolation.level=read_committed", "-f", "%k\t%s\n"),
            *("-X", "security.protocol=SASL_SSL", "-X", f"sasl.mechanisms={c['sasl_mechanism']}"),
            *("-X", f"sasl.username={c['sasl_plain_username']}"),
            *("-X", f"sasl.password={c['sasl_plain_password']}"),
            *("-X", f"ssl.ca.location={c['ssl_cafile']}"),
        ],
        capture_output=True,
        timeout=60,
        check=True,
    ).stdout
    by_kcat = {}
    for line in out.splitlines():
        key, value = line.split(b"\t", 1)
        by_kcat.setdefault(key.decode(), set()).add(value)
    assert by_kcat == got
    # budget-stats with the secured Kafka configuration: it reads the state (no broker call),
    # is charged to the telemetry budget, and prints no secret
    stats = cli(["budget-stats", "--config", "streamfilter.toml", "--json"], cwd=work)
    assert json.loads(stats.stdout)["telemetry_rho_spent"] > 0
    assert SASL_PASSWORDS["admin"] not in stats.stdout + stats.stderr


def failing(broker, tmp_path, name, **override):
    work = tmp_path / name
    work.mkdir()
    (work / "streamfilter.toml").write_text(secured_config(new_topics(), broker, **override))
    return work


def assert_one_clear_line(proc, started, *needles, code=6, within_s=20.0):
    elapsed = time.monotonic() - started
    *logs, line = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    # one clear line, last; before it at most the daemon's own INFO lines (logging is on by
    # default), never the client library's retries
    assert all(" INFO streamfilter." in x for x in logs), proc.stderr
    for needle in needles:
        assert needle in line, line
    assert elapsed < within_s, f"took {elapsed:.1f}s"
    for secret in SASL_PASSWORDS.values():
        assert secret not in proc.stderr


CASES = {
    "wrong SASL password": (
        {"sasl_plain_password": "not-the-password"},
        ("SASL authentication", "kafka.sasl_plain_password"),
    ),
    "wrong CA": ({"ssl_cafile": "CLIENT_CRT"}, ("kafka.ssl_cafile", "not signed")),
    "wrong host name": ({"bootstrap_servers": "BOOTSTRAP_IP"}, ("host name",)),
    "wrong key password": (
        {"ssl_certfile": "CLIENT_CRT", "ssl_keyfile": "CLIENT_KEY", "ssl_password": "wrong"},
        ("kafka.ssl_password",),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["run", "topics create"])
@pytest.mark.timeout(120)
def test_tls_and_sasl_failures_are_one_clear_line_and_fast(kafka_secured, tmp_path, case, command):
    broker = kafka_secured
    override, needles = CASES[case]
    files = {
        "CLIENT_CRT": str(broker.tls_dir / "client.crt"),
        "CLIENT_KEY": str(broker.tls_dir / "client.key"),
        "BOOTSTRAP_IP": f"127.0.0.1:{broker.port}",
    }
    override = {k: files.get(v, v) for k, v in override.items()}
    work = failing(broker, tmp_path, "w", **override)
    args = [*command.split(), "--config", "streamfilter.toml"]
    if command == "run":
        args += ["--until-end", "--testing"]
    started = time.monotonic()
    proc = cli(args, cwd=work, check=False, timeout=90)
    assert_one_clear_line(proc, started, *needles)


def test_sasl_mechanism_is_validated(kafka_secured, tmp_path):
    work = failing(kafka_secured, tmp_path, "m", sasl_mechanism="GSSAPI")
    proc = cli(["topics", "create", "--config", "streamfilter.toml"], cwd=work, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "kafka.sasl_mechanism" in proc.stderr and "SCRAM-SHA-512" in proc.stderr


# ----------------------------------------------------------------------------- least privilege


def acl(principal, resource_type, name, operation):
    from kafka.admin import (
        ACL,
        ACLOperation,
        ACLPermissionType,
        ACLResourcePatternType,
        ResourcePattern,
        ResourceType,
    )

    return ACL(
        principal=f"User:{principal}",
        host="*",
        operation=getattr(ACLOperation, operation),
        permission_type=ACLPermissionType.ALLOW,
        resource_pattern=ResourcePattern(
            getattr(ResourceType, resource_type), name, ACLResourcePatternType.LITERAL
        ),
    )


def run_acls(topics, group):
    """Exactly the ACLs docs/kafka.md lists for `run` (central mode, every section on Kafka)."""
    return {
        "READ events": acl("app", "TOPIC", topics["events"], "READ"),
        "READ queries": acl("app", "TOPIC", topics["queries"], "READ"),
        "WRITE releases": acl("app", "TOPIC", topics["releases"], "WRITE"),
        "READ releases": acl("app", "TOPIC", topics["releases"], "READ"),
        "WRITE rejects": acl("app", "TOPIC", topics["rejects"], "WRITE"),
        "READ group": acl("app", "GROUP", group, "READ"),
        "WRITE transactional id": acl(
            "app", "TRANSACTIONAL_ID", f"streamfilter-releases-{topics['releases']}", "WRITE"
        ),
    }


@pytest.mark.timeout(400)
def test_run_needs_exactly_the_documented_acls(kafka_secured, tmp_path):
    """A user with exactly the ACLs of docs/kafka.md runs the daemon; with one of them removed
    the run ends with one line naming what is missing (never "topics missing")."""
    broker = kafka_secured
    topics = new_topics()
    group = f"sf-{topics['events']}"
    admin_work = tmp_path / "admin"
    admin_work.mkdir()
    (admin_work / "streamfilter.toml").write_text(secured_config(topics, broker))
    cli(["topics", "create", "--config", "streamfilter.toml"], cwd=admin_work)
    produce(broker, topics, make_events(days=2, users=40))
    acls = run_acls(topics, group)
    admin = admin_client(broker.bootstrap, **broker.client())

    work = tmp_path / "app"  # one state: every run after the first is a restart
    work.mkdir()
    (work / "streamfilter.toml").write_text(secured_config(topics, broker, user="app"))

    def run_as_app():
        started = time.monotonic()
        proc = cli(
            ["run", "--config", "streamfilter.toml", "--until-end", "--testing"],
            cwd=work,
            check=False,
            timeout=120,
        )
        return proc, started

    try:
        proc, started = run_as_app()
        assert_one_clear_line(proc, started, topics["events"])
        assert "missing" not in proc.stderr
        admin.create_acls(list(acls.values()))
        time.sleep(1)
        proc, _ = run_as_app()
        assert proc.returncode == 0, proc.stderr
        for name, needle in [
            ("READ group", group),
            ("WRITE transactional id", "TransactionalId"),
            ("READ releases", topics["releases"]),
        ]:
            _delete(admin, acls[name])
            time.sleep(1)
            proc, started = run_as_app()
            assert_one_clear_line(proc, started, needle, within_s=60)
            admin.create_acls([acls[name]])
            time.sleep(1)
    finally:
        admin.close()


def _delete(admin, entry):
    from kafka.admin import ACLFilter, ResourcePatternFilter

    admin.delete_acls(
        [
            ACLFilter(
                principal=entry.principal,
                host=entry.host,
                operation=entry.operation,
                permission_type=entry.permission_type,
                resource_pattern=ResourcePatternFilter(
                    entry.resource_pattern.resource_type,
                    entry.resource_pattern.resource_name,
                    entry.resource_pattern.pattern_type,
                ),
            )
        ]
    )


@pytest.mark.timeout(120)
def test_simulate_local_over_kafka_fails_with_one_clear_line(kafka_secured, tmp_path):
    from tests.system.test_local_mode import config_text as local_config

    broker = kafka_secured
    topic = unique_topic("contributions")
    kafka = {
        "bootstrap_servers": broker.bootstrap,
        "group_id": topic,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": "not-the-password",
        "ssl_cafile": str(broker.tls_dir / "ca.crt"),
    }
    text = (
        local_config(tmp_path, "local").replace(
            "[local]\n", f'[local]\nkind = "kafka"\ntopic = "{topic}"\n'
        )
        + "[kafka]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in kafka.items())
    )
    (tmp_path / "local.toml").write_text(text)
    started = time.monotonic()
    proc = cli(["simulate-local", "--testing", "--config", "local.toml"], cwd=tmp_path, check=False)
    assert_one_clear_line(proc, started, "kafka.sasl_plain_password")
