"""Tuning databases under ``tuning_logs/<target>/<model-fingerprint>/``: locating, locking, repairing,
counting and pruning MetaSchedule's JSON-lines records.

MetaSchedule's JSONDatabase appends one line per record, so finished trials survive Ctrl-C or kill -9;
what can be lost is a half-written last line, which :func:`repair` drops (keeping a copy) with a warning.
Look-ups ignore the target, hence one database per target, and for targets that compile for the build
host's own CPU, one per CPU microarchitecture (a schedule measured on one CPU is no guide on another:
records from a Zen 3 ran 2x slower on a Zen 4 than records tuned there) -- see :func:`fingerprint`.

A pruned database is *packed*: its workload file (serialized TIR, ~95 % of the bytes) is stored
gzipped as ``database_workload.json.gz``, small enough to commit. ``tune`` unpacks before it appends;
``build`` reads either form.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gzip
import hashlib
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

from inferx_edge.errors import DatabaseBusyError, InferxError  # noqa: F401  (DatabaseBusyError re-exported)
from inferx_edge.package.atomic import atomic_write
from inferx_edge.records.tiles import has_tiles

WORKLOADS = "database_workload.json"
PACKED_WORKLOADS = WORKLOADS + ".gz"
RECORDS = "database_tuning_record.json"
FAILED_RUN = 1e9  # MetaSchedule stores failed builds/runs as 1e10 s


def default_root() -> Path:
    """``tuning_logs/`` of the checkout, or ``INFERX_TUNING_LOGS``."""
    env = os.environ.get("INFERX_TUNING_LOGS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "tuning_logs"


def fingerprint(
    model_sha256: str, input_shapes: dict[str, tuple[int, ...]], precision: str, cpu: str | None = None
) -> str:
    """Names a model's database: its content, pinned shapes, precision and, for targets that compile
    for the build host's CPU, that CPU's microarchitecture (LLVM's name, e.g. ``znver4``) (12 hex digits)."""
    key = json.dumps([model_sha256, sorted(input_shapes.items()), precision] + ([cpu] if cpu else []))
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def host_cpu_of(spec) -> str | None:
    """The CPU microarchitecture a target's kernels are tuned for when it is "this host's CPU", else None."""
    from inferx_edge.targets.registry import HOST_CPU

    if spec.is_cuda or spec.tvm_target.get("mcpu") != HOST_CPU:
        return None
    import tvm

    return str(tvm.target.codegen.llvm_get_system_cpu())


_THIS_CPU = object()


def model_database_dir(spec, imported, precision: str, root: Path | None = None, cpu=_THIS_CPU) -> Path:
    """Where the database for ``imported`` (an :class:`~inferx_edge.frontend.ImportedModel` with its
    shapes pinned) at ``precision`` on target ``spec`` lives; ``cpu``: the microarchitecture it was
    tuned on (default: this host's, :func:`host_cpu_of`)."""
    shapes = {t.name: t.shape for t in imported.inputs}
    fp = fingerprint(imported.sha256, shapes, precision, host_cpu_of(spec) if cpu is _THIS_CPU else cpu)
    return database_dir(spec.name, imported.name, fp, root)


def _holds_records(work_dir: Path) -> bool:
    return has_database(work_dir) or has_tiles(work_dir)


def locate_database(spec, imported, precision: str, root: Path | None = None) -> tuple[Path | None, str | None]:
    """The database to apply and, when it is not this CPU's own, a note saying whose it is.

    This host's exact microarchitecture first (what ``tune`` writes here); for a target that compiles
    for the build host's CPU with none, a database tuned on another CPU of the same ISA level
    (:data:`inferx_edge.targets.cpu.SAME_LEVEL`): its schedules were measured elsewhere but use only
    instructions this CPU has."""
    cpu = host_cpu_of(spec)
    exact = model_database_dir(spec, imported, precision, root, cpu)
    if _holds_records(exact):
        return exact, None
    if cpu is None:
        return None, None
    from inferx_edge.targets.cpu import same_level_cpus

    for other in same_level_cpus(cpu):
        work_dir = model_database_dir(spec, imported, precision, root, other)
        if _holds_records(work_dir):
            return work_dir, (
                f"no tuning database for this CPU ({cpu}); applied the one tuned on {other}, a CPU of the same "
                f"ISA level (tune here for this CPU's own: python -m inferx_edge tune --target {spec.name})"
            )
    return None, None


def find_database(spec, imported, precision: str, root: Path | None = None) -> Path | None:
    """The database :func:`model_database_dir` names, when it holds MetaSchedule records or int8 tile
    records (:mod:`inferx_edge.records.tiles`) (else None)."""
    work_dir = model_database_dir(spec, imported, precision, root)
    return work_dir if _holds_records(work_dir) else None


def has_database(work_dir: Path) -> bool:
    return (work_dir / RECORDS).exists() and ((work_dir / WORKLOADS).exists() or (work_dir / PACKED_WORKLOADS).exists())


def workload_bytes(work_dir: Path) -> bytes:
    """The workload file's content, packed or not (b"" when there is none)."""
    if (work_dir / WORKLOADS).exists():
        return (work_dir / WORKLOADS).read_bytes()
    if (work_dir / PACKED_WORKLOADS).exists():
        return gzip.decompress((work_dir / PACKED_WORKLOADS).read_bytes())
    return b""


def unpack(work_dir: Path) -> None:
    """Make the workload file plain for MetaSchedule to append to (a no-op when it is)."""
    packed, plain = work_dir / PACKED_WORKLOADS, work_dir / WORKLOADS
    if packed.exists():
        if not plain.exists():  # both exist only after an unpack killed before its last step
            with atomic_write(plain) as f:
                f.write(gzip.decompress(packed.read_bytes()))
        packed.unlink()


def pack(work_dir: Path) -> None:
    """Gzip the workload file (deterministic bytes: no name, no time stamp)."""
    plain = work_dir / WORKLOADS
    if plain.exists():
        with atomic_write(work_dir / PACKED_WORKLOADS) as f:
            f.write(gzip.compress(plain.read_bytes(), compresslevel=9, mtime=0))
        plain.unlink()


def snapshot(work_dir: Path, dest: Path) -> None:
    """Copy a database into ``dest`` in the plain form MetaSchedule reads, dropping a torn last line
    (a tuning run may be appending right now)."""
    (dest / WORKLOADS).write_bytes(workload_bytes(work_dir))
    (dest / RECORDS).write_bytes((work_dir / RECORDS).read_bytes())
    repair(dest, warn=lambda m: None)


def database_dir(target: str, model_name: str, fp: str, root: Path | None = None) -> Path:
    return (root or default_root()) / target / f"{model_name}-{fp}"


@contextlib.contextmanager
def locked(work_dir: Path):
    """Exclusive lock on a database for the duration of a tuning run."""
    work_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(work_dir / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
                raise DatabaseBusyError(
                    f"tuning database {work_dir} is in use by another tuning run (pid {holder}); wait for it "
                    f"to finish or stop it"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield work_dir
    finally:
        os.close(fd)  # closing releases the flock


def repair(work_dir: Path, warn=lambda m: print(f"warning: {m}", file=sys.stderr)) -> int:
    """Drop unusable lines from both files (a kill -9 mid-write, or JSON that is not a record / workload);
    keep them in ``*.corrupt``.

    Workload lines are indexed by position, so a bad workload line is only dropped when it is the last
    one (a torn write); a bad line in the middle is reported and the run stops. Returns lines dropped.
    """
    dropped = 0
    workloads = work_dir / WORKLOADS
    if workloads.exists():
        lines = workloads.read_bytes().splitlines(keepends=True)
        bad = [i for i, line in enumerate(lines) if not _is_workload(line)]
        if bad and bad != [len(lines) - 1]:
            raise InferxError(
                f"{workloads}: corrupt workload line(s) {[b + 1 for b in bad]} in the middle of the "
                f"file; records index workloads by line, so it cannot be repaired automatically"
            )
        if bad:
            _rewrite(workloads, lines, bad, warn)
            dropped += 1
    records = work_dir / RECORDS
    if records.exists():
        lines = records.read_bytes().splitlines(keepends=True)
        n_workloads = len(workload_bytes(work_dir).splitlines())
        bad = [i for i, line in enumerate(lines) if not _is_record(line) or json.loads(line)[0] >= n_workloads]
        if bad:
            _rewrite(records, lines, bad, warn)
            dropped += len(bad)
    return dropped


def _json(line: bytes):
    if not line.strip():
        return None
    try:
        return json.loads(line)
    except ValueError:
        return None


def _is_workload(line: bytes) -> bool:
    """``[structural hash, serialized module]`` (both strings)."""
    entry = _json(line)
    return isinstance(entry, list) and len(entry) == 2 and all(isinstance(x, str) for x in entry)


def _is_record(line: bytes) -> bool:
    """``[workload index, [trace, run seconds or null, target, args info]]``: a line that parses as JSON
    but has another shape (hand-edited, foreign) is as unusable as a torn one."""
    entry = _json(line)
    if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], int) and entry[0] >= 0):
        return False
    rec = entry[1]
    if not (isinstance(rec, list) and len(rec) >= 4 and isinstance(rec[0], list) and isinstance(rec[2], dict)):
        return False
    secs = rec[1]
    return secs is None or (
        isinstance(secs, list) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in secs)
    )


def _rewrite(path: Path, lines: list[bytes], bad: list[int], warn) -> None:
    with open(path.with_suffix(".corrupt"), "ab") as f:
        f.writelines(lines[i].rstrip(b"\n") + b"\n" for i in bad)
    drop = set(bad)
    keep = [line if line.endswith(b"\n") else line + b"\n" for i, line in enumerate(lines) if i not in drop]
    with atomic_write(path) as f:
        f.write(b"".join(keep))
    warn(f"{path.name}: skipped {len(bad)} corrupt line(s) (kept in {path.with_suffix('.corrupt').name})")


def trials_per_workload(work_dir: Path) -> dict[int, dict[str, float]]:
    """``{workload index: {"trials": n, "valid": n, "best_s": seconds}}`` from the records file."""
    stats: dict[int, dict[str, float]] = defaultdict(lambda: {"trials": 0, "valid": 0, "best_s": float("inf")})
    records = work_dir / RECORDS
    if records.exists():
        for line in open(records, "rb"):
            if not _is_record(line):
                continue
            workload, rec = json.loads(line)[:2]
            secs = rec[1] if len(rec) > 1 else None
            s = stats[workload]
            s["trials"] += 1
            if secs and min(secs) < FAILED_RUN:
                s["valid"] += 1
                s["best_s"] = min(s["best_s"], sum(secs) / len(secs))
    return dict(stats)


META = "inferx_tuning.json"


def trials_done(work_dir: Path) -> int:
    """Trials this database has seen: its records, or more if it was pruned since (see :func:`prune`)."""
    records = work_dir / RECORDS
    counted = sum(1 for line in open(records, "rb") if _is_record(line)) if records.exists() else 0
    meta = work_dir / META
    noted = json.loads(meta.read_text()).get("trials", 0) if meta.exists() else 0
    return max(counted, noted)


def note_trials(work_dir: Path, trials: int) -> None:
    total = max(trials, trials_done(work_dir))
    with atomic_write(work_dir / META, "w") as f:
        f.write(json.dumps({"trials": total}) + "\n")


def prune(work_dir: Path, keep: int = 1) -> tuple[int, int]:
    """Keep the ``keep`` fastest valid records per workload (what ``build`` uses) and only the workloads
    they reference; returns (records before, after). The trial count is kept in ``inferx_tuning.json``
    so a later run with the same budget still knows the work was done. The result is packed (:func:`pack`)."""
    note_trials(work_dir, trials_done(work_dir))
    unpack(work_dir)
    records, workloads = work_dir / RECORDS, work_dir / WORKLOADS
    lines = [line for line in records.read_bytes().splitlines(keepends=True) if _is_record(line)]
    by_workload: dict[int, list[tuple[float, list]]] = defaultdict(list)
    for line in lines:
        entry = json.loads(line)
        secs = entry[1][1] if len(entry[1]) > 1 else None
        if secs and min(secs) < FAILED_RUN:
            by_workload[entry[0]].append((sum(secs) / len(secs), entry))
    wl_lines = workloads.read_bytes().splitlines(keepends=True)
    order = sorted(by_workload)
    renumber = {old: new for new, old in enumerate(order)}
    kept = []
    for old in order:
        for _, entry in sorted(by_workload[old], key=lambda r: r[0])[:keep]:
            entry[0] = renumber[old]
            kept.append((json.dumps(entry) + "\n").encode())
    for path, body in ((workloads, b"".join(wl_lines[old] for old in order)), (records, b"".join(kept))):
        with atomic_write(path) as f:
            f.write(body)
    pack(work_dir)
    return len(lines), len(kept)
