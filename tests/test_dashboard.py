"""The Grafana dashboard (tools/grafana/memchat.json) queries only what /metrics exports,
and docker-compose.yml provisions it: its data source, its provider, the file itself.

Each panel's PromQL is reduced to the series names it selects (strings, label matchers,
ranges, grouping clauses and Grafana's variables taken out; a name followed by `(` is a
function or an aggregation). A name must be one that a scrape of the running service
shows as a sample (`memchat_prompt_tokens_total`, `memchat_turn_stage_seconds_bucket`),
so a counter queried without `_total`, or a `_bucket` of something that is no histogram,
fails as an unknown name does.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from litestar.testing import AsyncTestClient
from prometheus_client.parser import text_string_to_metric_families

from app.factory import create_app
from app.settings import Settings
from tests.clients import local_client
from tests.fakes import HashEmbedder, ScriptedEngine
from tests.test_api_sessions import create_session

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "tools" / "grafana" / "memchat.json"

# Words of PromQL that are neither series nor followed by "(".
KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_NAME = re.compile(r"(?<![\w.$])([A-Za-z_:][\w:]*)(?![\w:]|\s*\()")


def series_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = _STRING.sub("", expression)  # first: a string may hold braces or brackets
    for pattern in (_MATCHERS, _RANGE, _GROUPING, _VARIABLE):
        text = pattern.sub(" ", text)
    return {name for name in _NAME.findall(text) if name.lower() not in KEYWORDS}


def panels(dashboard: dict) -> Iterator[dict]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", ())  # a collapsed row holds its panels


def expressions(dashboard: dict) -> Iterator[str]:
    for panel in panels(dashboard):
        for target in panel.get("targets", ()):
            yield target["expr"]
    for variable in dashboard.get("templating", {}).get("list", ()):
        query = variable.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if variable.get("type") == "query" and query:
            yield query


def queried(dashboard: dict) -> set[str]:
    return {name for expression in expressions(dashboard) for name in series_names(expression)}


def unexported(dashboard: dict, exported: set[str]) -> list[str]:
    return sorted(queried(dashboard) - exported)


def load_dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_series_names_of_promql() -> None:
    expression = (
        "histogram_quantile(0.95, sum by (le, stage) "
        '(rate(memchat_turn_stage_seconds_bucket{stage=~"a|b"}[$__rate_interval]))) '
        "/ on (instance) group_left max(up_time offset 5m) "
        'and sum without (route) (rate(requests_total{route="/v1/{id}"}[${window}])) > bool 1e3'
    )
    assert series_names(expression) == {
        "memchat_turn_stage_seconds_bucket",
        "up_time",
        "requests_total",
    }


@pytest.fixture
async def client(tmp_path: Path, sqlite_url: str) -> AsyncIterator[AsyncTestClient]:
    settings = Settings(data_dir=tmp_path / "data", database_url=sqlite_url)
    app = create_app(settings, embedder=HashEmbedder(), engine=ScriptedEngine())
    async with local_client(app) as test_client:
        yield test_client


async def exported_after_a_turn_and_an_import(client: AsyncTestClient) -> set[str]:
    """Every sample name of a scrape after a chat turn and a history import (labelled
    series appear once something was counted under a label)."""
    session = await create_session(client)
    turn = await client.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "I am allergic to peanuts"}
    )
    assert turn.status_code == 200, turn.text
    history = {"messages": [{"role": "user", "content": "I live in Lisbon"}]}
    imported = await client.post(f"/v1/sessions/{session['id']}/history", json=history)
    assert imported.status_code == 201, imported.text
    scrape = await client.get("/metrics")
    assert scrape.status_code == 200
    return {
        sample.name
        for family in text_string_to_metric_families(scrape.text)
        for sample in family.samples
    }


async def test_every_metric_the_dashboard_queries_is_exported(client: AsyncTestClient) -> None:
    dashboard = load_dashboard()
    exported = await exported_after_a_turn_and_an_import(client)
    assert unexported(dashboard, exported) == []
    assert queried(dashboard) == {
        "memchat_turn_stage_seconds_bucket",
        "memchat_turn_stage_seconds_count",
        "memchat_prompt_tokens_total",
        "memchat_cached_prompt_tokens_total",
        "memchat_completion_tokens_total",
        "memchat_turn_memories_sum",
        "memchat_turn_memories_count",
        "memchat_context_tokens_sum",
        "memchat_context_tokens_count",
        "memchat_prefix_reuse_ratio_sum",
        "memchat_prefix_reuse_ratio_count",
        "memchat_engine_prefix_cache_hit_rate",
        "memchat_index_vectors",
        "memchat_engine_queue_turns",
        "memchat_engine_queue_max_turns",
        "memchat_imported_messages_total",
        "memchat_http_requests_total",
        "memchat_log_write_failures_total",
    }

    # A panel that queries a name /metrics lacks, or a suffix its kind lacks, is found.
    broken = copy.deepcopy(dashboard)
    targets = next(p for p in panels(broken) if p["title"] == "Tokens per second")["targets"]
    targets[0]["expr"] = "sum(rate(memchat_prompt_tokens[5m]))"  # the counter without _total
    targets[1]["expr"] = "sum(rate(memchat_no_such_metric_total[5m]))"
    targets[2]["expr"] = "histogram_quantile(0.5, rate(memchat_prompt_tokens_bucket[5m]))"
    assert unexported(broken, exported) == [
        "memchat_no_such_metric_total",
        "memchat_prompt_tokens",
        "memchat_prompt_tokens_bucket",
    ]


def test_every_panel_reads_the_provisioned_data_source() -> None:
    datasource = yaml.safe_load((ROOT / "tools" / "grafana" / "datasource.yml").read_text())
    [source] = datasource["datasources"]
    assert (source["type"], source["url"]) == ("prometheus", "http://prometheus:9090")
    dashboard = load_dashboard()
    graphs = [p for p in panels(dashboard) if p["type"] != "row"]
    assert len(graphs) == 14
    for panel in graphs:
        references = [panel["datasource"], *(t["datasource"] for t in panel["targets"])]
        for reference in references:
            assert reference == {"type": "prometheus", "uid": source["uid"]}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "memchat"


def grafana_mounts(services: dict) -> dict[str, str]:
    """Container path -> host path of the Grafana service's read-only files."""
    mounts = {}
    for volume in services["grafana"]["volumes"]:
        source, target, *mode = volume.split(":")
        if source.startswith("./"):
            assert mode == ["ro"], volume
            mounts[target] = source
    return mounts


def test_compose_provisions_the_data_source_the_provider_and_the_dashboard() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    mounts = grafana_mounts(services)
    provisioning = "/etc/grafana/provisioning"
    assert mounts[f"{provisioning}/datasources/memchat.yml"] == "./tools/grafana/datasource.yml"
    provider_file = mounts[f"{provisioning}/dashboards/memchat.yml"]
    assert provider_file == "./tools/grafana/dashboards.yml"
    [provider] = yaml.safe_load((ROOT / provider_file).read_text())["providers"]
    assert provider["type"] == "file"
    # The provider's folder holds the dashboard file, mounted from the one tested here.
    dashboards = {
        target: source
        for target, source in mounts.items()
        if Path(target).parent == Path(provider["options"]["path"])
    }
    assert dashboards == {"/etc/grafana/dashboards/memchat.json": "./tools/grafana/memchat.json"}
    assert (ROOT / "tools" / "grafana" / "memchat.json").resolve() == DASHBOARD
    home = services["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home in dashboards
    assert services["grafana"]["depends_on"] == {"prometheus": {"condition": "service_started"}}
    assert services["grafana"]["ports"] == ["127.0.0.1:${GRAFANA_PORT:-3000}:3000"]


def test_prometheus_scrapes_each_replica_of_both_profiles() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    prometheus = services["prometheus"]
    assert "profiles" not in prometheus and "profiles" not in services["grafana"]
    assert prometheus["volumes"][0] == "./tools/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
    config = yaml.safe_load((ROOT / "tools" / "prometheus.yml").read_text())
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    [discovery] = job["dns_sd_configs"]
    replicated = sorted(name for name, s in services.items() if "replicas" in s.get("deploy", {}))
    assert sorted(discovery["names"]) == replicated == ["app", "app-cpu"]
    assert (discovery["type"], discovery["port"]) == ("A", 8000)
