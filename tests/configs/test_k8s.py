"""configs/k8s/: every manifest valid against the Kubernetes schemas (offline, strict), probes on the
server's real health paths, and the HPA's metric the one the prometheus-adapter rule makes."""

from __future__ import annotations

import pytest
import yaml

from inferx_edge.serve.openapi import ROUTES
from tests.helpers import REPO

kv = pytest.importorskip("kubernetes_validate")
K8S = REPO / "configs" / "k8s"
MANIFESTS = sorted(K8S.glob("*.yaml"))


def _docs():
    return [(p.name, d) for p in MANIFESTS for d in yaml.safe_load_all(p.read_text()) if d]


@pytest.mark.parametrize("name,doc", _docs(), ids=lambda v: v if isinstance(v, str) else v.get("kind"))
def test_manifest_is_valid_kubernetes(name, doc):
    kv.validate(doc, "1.30.0", strict=True)


def test_probes_and_autoscaling_use_what_the_server_serves():
    paths = {r.path for r in ROUTES}
    docs = dict(_docs())
    deployments = [d for _, d in _docs() if d["kind"] == "Deployment"]
    assert len(deployments) == 2
    for d in deployments:
        c = d["spec"]["template"]["spec"]["containers"][0]
        for probe in ("livenessProbe", "readinessProbe"):
            assert c[probe]["httpGet"]["path"] in paths
        port = [a for a in c["args"] if a.startswith("--port=")][0].split("=")[1]
        assert int(port) == c["ports"][0]["containerPort"]
        assert c["args"][0] == "serve"
    hpa = docs["hpa.yaml"]
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    rules = yaml.safe_load(docs["prometheus-adapter.yaml"]["data"]["config.yaml"])["rules"]
    assert metric in {r["name"]["as"] for r in rules}
    from inferx_edge.serve.metrics import TRITON_METRICS

    for r in rules:
        assert r["seriesQuery"].split("{")[0] in TRITON_METRICS


def test_grafana_dashboard_queries_only_metrics_the_server_exports():
    import json
    import re

    from inferx_edge.serve.metrics import ServerMetrics

    dash = json.loads((REPO / "configs" / "grafana" / "inferx_edge_serve.json").read_text())
    exported = set(ServerMetrics.SPEC) | {"inferx_request_latency_seconds_bucket", "inferx_batch_rows_bucket"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    used = {m for e in exprs for m in re.findall(r"\b((?:nv|inferx)_[a-z_]+)", e)}
    assert used and used <= exported, used - exported
    assert any(p["type"] == "heatmap" for p in dash["panels"])
