"""What a deploy reports: where it installed, what it replaced, the self-test's answer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class DeployResult:
    destination: str
    installed: str | None
    previous: str | None
    sha256: str | None
    selftest: str | None = None
    notes: list[str] = field(default_factory=list)
