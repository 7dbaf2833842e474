"""The RPC config: found where a pip install can see it, entries under aliases, errors naming the key."""

from __future__ import annotations

import pytest

from inferx_edge.errors import UsageError
from inferx_edge.tune.runners import RPCSettings, config_paths, rpc_from_config


def test_config_is_found_by_flag_env_and_xdg(tmp_path, monkeypatch):
    cfg = tmp_path / "rpc.yaml"
    cfg.write_text("jetson-orin:\n  tracker: 192.168.55.100:9190\n  key: orin\n")
    # an alias names the same target as its canonical name
    assert rpc_from_config("jetson-agx-orin-64gb", cfg) == RPCSettings("192.168.55.100", 9190, "orin")
    assert rpc_from_config("h200", cfg) is None
    monkeypatch.setenv("INFERX_CONFIG", str(cfg))
    assert config_paths()[0] == cfg and rpc_from_config("jetson-agx-orin-64gb") is not None
    monkeypatch.delenv("INFERX_CONFIG")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "inferx_edge").mkdir(parents=True)
    (tmp_path / "xdg" / "inferx_edge" / "rpc.yaml").write_text(cfg.read_text())
    assert rpc_from_config("jetson-agx-orin-64gb") is not None
    with pytest.raises(UsageError, match="config file not found"):
        rpc_from_config("h200", tmp_path / "missing.yaml")


@pytest.mark.parametrize(
    "text,message",
    [
        ("jetson-orin: [oops\n", "line [0-9]+: not valid YAML"),
        ("jetson-orn:\n  tracker: h:1\n  key: k\n", "did you mean 'jetson-orin'"),
        ("jetson-orin:\n  tracker: h:1\n  key: k\n  port: 3\n", "unknown key\\(s\\) \\['port'\\]"),
        ("jetson-orin: h:1\n", "must map to"),
        ("jetson-orin:\n  tracker: 0.0.0.0:9190\n  key: k\n", "bind address"),
    ],
)
def test_bad_configs_are_named(tmp_path, text, message):
    cfg = tmp_path / "rpc.yaml"
    cfg.write_text(text)
    with pytest.raises(UsageError, match=message):
        rpc_from_config("h200", cfg)


def test_a_networked_tracker_gets_a_warning():
    assert RPCSettings("127.0.0.1", 9190, "k").warning() is None
    assert "no authentication" in RPCSettings("192.168.55.100", 9190, "k").warning()
