"""Writing any directory safely: its lock (one writer at a time, stale locks taken over), files
replaced whole (`write_json_atomic`), one-line reads of JSON it owns, checksums, and one-line
messages for a full disk. What the directories hold has its own owner: a run (manifest, shards)
is geoprobe/store.py's, a trained model's is bridges/checkpoint.py's.

Every command that writes a directory (extract, scan, bridge, sweep, dsl train) holds
`.geoprobe.lock` in it for as long as it runs. The lock file records the holder (pid, host,
command, process start time); a second process is refused at once with one line naming that
holder. A lock left by a process that no longer exists (kill -9, a crash, a reboot) is taken
over. Ranks started by hand (`--rank/--world-size`) share a directory on purpose: each holds its
own `.geoprobe.rank-R.lock`, so two processes with the same rank are still refused.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import time
from contextlib import contextmanager
from pathlib import Path

from geoprobe.errors import BadInput, short

LOCK = ".geoprobe.lock"
_held: dict[Path, int] = {}  # lock path -> nesting depth in this process (scan holds what extract locks again)
_created: dict[Path, list[Path]] = {}  # lock path -> the directories taking it created (removed if left empty)


def lock_name(rank: int = 0) -> str:
    return LOCK if rank == 0 else f".geoprobe.rank-{rank:03d}.lock"


def is_empty(directory: Path) -> bool:
    """No entries besides locks: what a directory holding nothing yet looks like to a command."""
    directory = Path(directory)
    return not directory.exists() or all(is_lock(p) for p in directory.iterdir())


def is_lock(path: Path) -> bool:
    return path.name.startswith(".geoprobe.") and path.name.endswith(".lock")


def clear(directory: Path) -> None:
    """--force: remove everything in `directory` but the locks (which the ranks of this run hold)."""
    for entry in Path(directory).iterdir() if Path(directory).is_dir() else ():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        elif not is_lock(entry):
            entry.unlink()


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (so a recycled pid is not mistaken for the holder)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname():
        return True  # another machine's process cannot be checked from here: assume it runs
    pid = int(holder.get("pid", -1))
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    recorded, now = holder.get("started"), _start_time(pid)
    return recorded is None or now is None or recorded == now


def _describe(holder: dict, path: Path) -> str:
    what = holder.get("command", "geoprobe")
    return (f"{path.parent} is in use by '{what}' (pid {holder.get('pid')} on {holder.get('host')}, since "
            f"{holder.get('since', '?')}); wait for it or use another --out (if that process is gone, delete {path})")


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # half-written by a process killed while creating it: treated as stale below


def holder(directory: Path, rank: int = 0) -> dict | None:
    """The live process holding `directory`'s lock (its pid, host, command and since), or None."""
    found = _read(Path(directory) / lock_name(rank))
    return found if found and _alive(found) else None


def acquire(directory: Path, command: str, rank: int = 0) -> Path:
    """Create `directory` if needed and take its lock; refuse (BadInput) when a live process holds it."""
    directory = Path(directory)
    path = (directory / lock_name(rank)).absolute()  # one key however the caller spells the folder
    if path in _held:
        _held[path] += 1
        return path
    missing = [p for p in (directory, *directory.absolute().parents) if not p.exists()]
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"output directory {directory} is not writable ({exc.strerror or exc})") from exc
    me = {"pid": os.getpid(), "host": socket.gethostname(), "started": _start_time(os.getpid()),
          "command": command, "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(2):  # the second try follows the removal of a stale lock
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder and _alive(holder):
                raise BadInput(_describe(holder, path)) from None
            path.unlink(missing_ok=True)  # stale: its process is gone
            continue
        except OSError as exc:
            raise BadInput(f"cannot lock {directory} ({exc.strerror or exc})") from exc
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(me) + "\n")
        _held[path] = 1
        _created[path] = missing
        return path
    holder = _read(path)
    raise BadInput(_describe(holder, path))


def release(path: Path) -> None:
    """Drop one hold of the lock; the last one removes the file (and the directory, if the command
    created it and wrote nothing else)."""
    depth = _held.get(path, 0) - 1
    if depth > 0:
        _held[path] = depth
        return
    _held.pop(path, None)
    path.unlink(missing_ok=True)
    for directory in _created.pop(path, []):  # deepest first
        try:
            directory.rmdir()  # only when empty: a refused or failed first run leaves nothing behind
        except OSError:
            break


@contextmanager
def holding(directory: Path, command: str, rank: int = 0):
    """`with holding(out, "extract"):` the directory is this process's until the block ends."""
    path = acquire(directory, command, rank)
    try:
        yield path
    finally:
        release(path)


def disk_full_message(path: Path, needed_bytes: int | None = None) -> str:
    """One line for ENOSPC: where, how much is free, and (when known) how much the run still needs."""
    free = shutil.disk_usage(nearest_existing(Path(path))).free
    need = f"; the run still needs about {human(needed_bytes)}" if needed_bytes else ""
    return (f"disk full while writing {path} ({human(free)} free{need}); free some space and rerun the same "
            "command: it resumes from what was written")


def is_disk_full(exc: BaseException) -> bool:
    """ENOSPC or a quota, also when a library (safetensors) reports it in its own error type."""
    if isinstance(exc, OSError) and exc.errno is not None:
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(text in str(exc) for text in ("No space left on device", "os error 28", "Disk quota exceeded"))


def nearest_existing(path: Path) -> Path:
    """`path` itself, or its closest ancestor that exists (what a command would write under)."""
    return next(p for p in (path, *path.absolute().parents) if p.exists())


def write_json_atomic(path: Path, data) -> None:
    """Replace `path` whole: a reader (or a resume after kill -9) never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: leave no partial file holding space
        raise
    os.replace(tmp, path)


def read_json(path: Path, missing: str):
    """A JSON file the run or checkpoint directory owns; one line (`missing`, or that it is cut
    short) when it cannot be read."""
    if not path.is_file():
        raise BadInput(missing)
    try:
        return json.loads(path.read_text())
    except (ValueError, OSError) as exc:
        raise BadInput(f"{path} is truncated or not JSON ({short(exc)}); delete it or use --force") from exc


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}" if unit != "B" else f"{int(size)} B"
        size /= 1024
    return f"{size:.1f} TiB"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    """The SHA-256 of a file, read in 4 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
