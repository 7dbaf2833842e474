"""Fail if the default install of a distribution pulls a GPL or AGPL package (LGPL is allowed).

Walks the installed dependency closure of ``inferx_edge`` without extras (what ``pip install
inferx_edge`` brings), reads each distribution's licence metadata (``License-Expression``,
``License``, trove classifiers) and prints a table. Exit 1 when a strong-copyleft licence is found,
2 when a dependency of the closure is not installed (the check would be incomplete).

    python scripts/check_licenses.py [--dist inferx_edge] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: GPL-family identifiers that forbid closed redistribution of a combined work (LGPL/GPL-with-exception
#: are not matched: "LGPL" and "Lesser" are excluded before this test)
_COPYLEFT = re.compile(r"\b(A?GPL|GNU (Affero )?General Public License)", re.I)
_WEAK = re.compile(r"\b(LGPL|Lesser General Public|Library General Public)", re.I)
#: a GPL with a linking exception (SPDX ``WITH Classpath-exception-2.0``, "GPL with runtime exception")
_EXCEPTION = re.compile(r"\bwith\b[^;()]*\bexception\b", re.I)


def licence_of(dist: metadata.Distribution) -> str:
    """The licence a distribution declares: its SPDX expression, else its License field, else classifiers."""
    meta = dist.metadata
    expression = meta.get("License-Expression")
    if expression:
        return expression.strip()
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    field = (meta.get("License") or "").strip()
    if field and len(field) < 200 and "\n" not in field:
        return field if not classifiers else f"{field} ({'; '.join(classifiers)})"
    return "; ".join(classifiers) or (field.splitlines()[0][:80] if field else "UNKNOWN")


def is_strong_copyleft(licence: str) -> bool:
    """GPL or AGPL (any version), not LGPL and not GPL with a linking exception. An SPDX ``OR`` offers a
    choice: the package passes when any alternative is permissive."""
    for alternative in re.split(r"\s+OR\s+", licence):
        text = _WEAK.sub("", alternative)
        if not _COPYLEFT.search(text) or _EXCEPTION.search(text):
            return False
    return True


def closure(root: str) -> tuple[dict[str, metadata.Distribution], list[str]]:
    """Installed distributions ``root`` needs without extras, by canonical name, and the missing ones."""
    found: dict[str, metadata.Distribution] = {}
    missing: list[str] = []
    todo = [root]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in found or name in missing:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
            continue
        found[name] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra's dependency, or one for another platform
            todo.append(req.name)
    return found, missing


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dist", default="inferx_edge", help="distribution whose default install is checked")
    ap.add_argument("--json", action="store_true", help="print the table as JSON")
    args = ap.parse_args(argv)
    found, missing = closure(args.dist)
    rows = [
        {"package": d.metadata["Name"], "version": d.version, "license": licence_of(d)}
        for _, d in sorted(found.items())
    ]
    bad = [r for r in rows if is_strong_copyleft(r["license"])]
    if args.json:
        print(json.dumps({"packages": rows, "copyleft": bad, "missing": missing}, indent=2))
    else:
        width = max(len(r["package"]) for r in rows)
        for r in rows:
            flag = "  <- GPL/AGPL" if r in bad else ""
            print(f"{r['package']:<{width}}  {r['version']:<14}  {r['license'][:90]}{flag}")
    if missing:
        print(f"error: not installed, so not checked: {', '.join(missing)}", file=sys.stderr)
        return 2
    if bad:
        names = ", ".join(f"{r['package']} ({r['license']})" for r in bad)
        print(f"error: the default install of {args.dist} pulls GPL/AGPL packages: {names}", file=sys.stderr)
        return 1
    print(f"ok: {len(rows)} packages in the default install of {args.dist}, none GPL/AGPL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
