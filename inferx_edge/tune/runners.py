"""Where candidates are measured: this machine, or a device behind a TVM RPC tracker."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

import yaml

from inferx_edge.errors import UsageError
from inferx_edge.targets import TargetSpec

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class RPCSettings:
    """A TVM RPC tracker and the key the device registered with (``rpc_server --key``)."""

    host: str
    port: int
    key: str

    @classmethod
    def parse(cls, hostport: str, key: str | None) -> RPCSettings:
        host, _, port = hostport.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"--rpc must be HOST:PORT of a TVM RPC tracker, got '{hostport}'")
        if not key:
            raise UsageError("--rpc needs --key: the key the device's rpc_server registered with")
        if host in ("0.0.0.0", "::", "[::]"):
            raise UsageError(f"--rpc {hostport}: 0.0.0.0 is a bind address, not a tracker to connect to; give its IP")
        return cls(host, int(port), key)

    def warning(self) -> str | None:
        """A one-line warning when the tracker is reached over a network: TVM RPC is unauthenticated."""
        import ipaddress

        try:
            addr = ipaddress.ip_address(self.host.strip("[]"))
        except ValueError:
            addr = None
        if addr is not None and addr.is_loopback or self.host == "localhost":
            return None
        scope = "a private network" if addr is not None and addr.is_private else "the network"
        return (
            f"warning: TVM RPC has no authentication or encryption; the tracker {self.host}:{self.port} is on "
            f"{scope}: keep tracker and device server on a link only you can reach (docs/security.md)"
        )


def config_paths(explicit: Path | None = None) -> list[Path]:
    """Where the RPC config is looked for, first match wins: ``explicit`` (``tune --config``), then
    ``$INFERX_CONFIG``, ``$XDG_CONFIG_HOME/inferx_edge/rpc.yaml`` (``~/.config/...``), and a source
    checkout's ``configs/rpc.yaml``."""
    import os

    if explicit is not None:
        return [Path(explicit)]
    paths = []
    if os.environ.get("INFERX_CONFIG"):
        paths.append(Path(os.environ["INFERX_CONFIG"]))
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    paths += [Path(config_home) / "inferx_edge" / "rpc.yaml", CONFIG_DIR / "rpc.yaml"]
    return paths


def rpc_from_config(target: str, config: Path | None = None) -> RPCSettings | None:
    """The RPC settings for ``target`` from the first config file of :func:`config_paths`:
    ``{target or alias: {tracker: HOST:PORT, key: KEY}}`` (see configs/rpc.example.yaml). Every entry is
    validated (unknown targets and keys named), not only the one asked for."""
    from inferx_edge.targets import get_target

    path = next((p for p in config_paths(config) if p.exists()), None)
    if path is None:
        if config is not None:
            raise UsageError(f"config file not found: {config}")
        return None
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"{path}{where}: not valid YAML ({getattr(exc, 'problem', exc)})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: expected a mapping of target name to {{tracker, key}}")
    found = None
    for name, entry in data.items():
        spec = get_target(str(name))  # an unknown name: did-you-mean with every valid target
        if not isinstance(entry, dict):
            raise UsageError(f"{path}: '{name}' must map to {{tracker: HOST:PORT, key: KEY}}")
        unknown = set(entry) - {"tracker", "key"}
        if unknown:
            raise UsageError(f"{path}: unknown key(s) {sorted(unknown)} under '{name}'; valid: tracker, key")
        settings = RPCSettings.parse(str(entry.get("tracker", "")), entry.get("key"))
        if spec.name == target:
            found = settings
    return found


def is_jetson() -> bool:
    return Path("/etc/nv_tegra_release").exists()


def check_local_measurement(spec: TargetSpec) -> None:
    """Refuse local tuning for a target this machine cannot run, naming both ways forward."""
    here = {"amd64": "x86_64", "arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    ways = (
        f"either (1) measure on the device over TVM RPC (unauthenticated: keep it on a private link, e.g. "
        f"Jetson USB device mode): on this host run 'python -m tvm.exec.rpc_tracker --host HOST_IP_ON_THAT_LINK "
        f"--port 9190', on the device 'python -m tvm.exec.rpc_server --host DEVICE_IP_ON_THAT_LINK "
        f"--tracker HOST_IP_ON_THAT_LINK:9190 --key {spec.name}"
        + (" --no-fork" if spec.is_cuda else "")
        + "' (never --host 0.0.0.0 on a shared network), then "
        f"'python -m inferx_edge tune --target {spec.name} --rpc HOST_IP_ON_THAT_LINK:9190 --key {spec.name}' "
        f"(or put tracker/key in configs/rpc.yaml); or (2) run 'python -m inferx_edge tune --target {spec.name}' "
        f"on the device itself"
    )
    if spec.host_arch != here or (spec.name.startswith("jetson") and not is_jetson()):
        raise UsageError(
            f"cannot tune for {spec.name} here: this {here} host is not a {spec.description}. To tune, {ways}"
        )
    if spec.is_cuda:
        import tvm

        dev = tvm.cuda(0)
        have = dev.compute_version.replace(".", "") if dev.exist else None
        if have != spec.cuda_arch.removeprefix("sm_").rstrip("a"):
            found = f"an sm_{have} GPU" if have else "no CUDA GPU"
            raise UsageError(
                f"cannot tune for {spec.name} ({spec.cuda_arch}) here: this host has {found}. To tune, {ways}"
            )
