"""Writing planned files without ever losing a byte: the policy of `gpudoctor fix`, over the one writer
(gpudoctor.fileio.write_output, which does the atomic replace, the content check and the backups).

- The file written is the one named, or, for a symlink, its target only when that target lies in
  the symlink's own directory (a link to /etc/... or ../other is refused, nothing is written): the rule
  of every gpudoctor writer (gpudoctor.fileio.link_target).
- Every file is checked before any is written: still the content that was planned (sha256 of the
  bytes read then), a regular file, in a writable directory. One refusal writes nothing at all; the
  writer checks the content once more as it writes.
- The original is kept beside it as `NAME.gpudoctor.bak` (`.gpudoctor.bak.1`, `.2`, ... when an
  earlier backup exists, so no backup is ever overwritten), with the original's permissions.
- One writer at a time: every file is locked (flock) before the checks and until all are written; a second
  `fix --apply` of the same file meanwhile backs off with one line, exit 2, nothing written. Temporary files a
  killed writer left (`.gpudoctor-HOST.PID.*.tmp`, its pid gone) are removed by the next write there
  (gpudoctor.fileio.sweep_temporaries).
Restore with `mv NAME.gpudoctor.bak NAME`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from dataclasses import dataclass

from gpudoctor.fileio import BACKUP_SUFFIX, FileIOError, exclusive, link_target, write_output

__all__ = ["BACKUP_SUFFIX", "Planned", "WriteRefused", "real_target", "write_all", "write_env_file"]


class WriteRefused(ValueError):
    """A file that must not be written: one line, exit 2, every file left as it was."""


@dataclass(frozen=True)
class Planned:
    path: str  # as the user named it
    original: bytes
    new_text: str

    @property
    def new_bytes(self) -> bytes:
        return self.new_text.encode("utf-8", errors="surrogateescape")


def real_target(path: str) -> str:
    """The file to write: path itself, or its symlink target when that stays in path's directory (the rule
    of every writer: gpudoctor.fileio.link_target)."""
    try:
        return link_target(path)
    except FileIOError as e:
        raise WriteRefused(str(e)) from None


def _check(p: Planned) -> str:
    target = real_target(p.path)
    try:
        st = os.stat(target)
        with open(target, "rb") as fh:
            now = fh.read()
    except OSError as e:
        raise WriteRefused(f"{p.path}: cannot read it again before writing ({e.strerror or e})") from None
    if not stat.S_ISREG(st.st_mode):
        raise WriteRefused(f"{p.path}: not a regular file")
    if hashlib.sha256(now).digest() != hashlib.sha256(p.original).digest():
        raise WriteRefused(f"{p.path}: changed since gpudoctor read it; run gpudoctor fix again")
    directory = os.path.dirname(os.path.abspath(target))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise WriteRefused(
            f"{p.path}: its directory {directory} is not writable (the backup and the new file go there)"
        )
    return target


def write_all(planned: list[Planned]) -> dict[str, str]:
    """Write every planned file (after checking all of them); returns {path: backup path}. Every file is locked
    first (gpudoctor.fileio.exclusive) and stays locked until all are written: a second `fix --apply` of the
    same file backs off with one line (exit 2), so one change is never made, nor backed up, twice."""
    changing = [p for p in planned if p.new_bytes != p.original]
    backups: dict[str, str] = {}
    try:
        with contextlib.ExitStack() as held:
            for p in changing:
                held.enter_context(exclusive([real_target(p.path)], p.path))
            targets = [(p, _check(p)) for p in changing]
            for p, target in targets:
                backup = write_output(target, p.new_bytes, backup=True, expect=p.original)
                if backup is not None:
                    backups[p.path] = backup
    except FileIOError as e:
        raise WriteRefused(str(e)) from None
    return backups


def write_env_file(path: str, text: str) -> str | None:
    """--env-file: written atomically; an existing file is backed up first. Returns the backup path."""
    target = real_target(path)
    data = text.encode("utf-8")
    old = None
    if os.path.exists(target):
        if not stat.S_ISREG(os.stat(target).st_mode):
            raise WriteRefused(f"--env-file {path}: not a regular file")
        with open(target, "rb") as fh:
            old = fh.read()
        if old == data:
            return None
    elif not os.path.isdir(os.path.dirname(os.path.abspath(target))):
        raise WriteRefused(f"--env-file {path}: no directory {os.path.dirname(os.path.abspath(target))}")
    try:
        return write_output(target, data, what="--env-file", backup=old is not None, expect=old)
    except FileIOError as e:
        raise WriteRefused(str(e)) from None
