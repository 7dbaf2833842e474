"""Deliver artifacts to devices: local directory, OpenSSH host, or TVM RPC server."""

from inferx_edge.deploy.install import DeployResult, deploy, parse_destination, rollback

__all__ = ["DeployResult", "deploy", "parse_destination", "rollback"]
