"""Writing planned files without ever losing a byte.

- The file written is the one named, or, for a symlink, its target only when that target lies in
  the symlink's own directory (a link to /etc/... or ../other is refused, nothing is written).
- Every file is checked before any is written: still the content that was planned (sha256 of the
  bytes read then), a regular file, writable. One refusal writes nothing at all.
- The original is kept beside it as `NAME.gpudoctor.bak` (`.gpudoctor.bak.1`, `.2`, ... when an
  earlier backup exists, so no backup is ever overwritten), with the original's permissions.
- The new content goes to a temporary file in the same directory, is flushed to disk, gets the
  original's mode and owner, and replaces the file with os.replace (atomic on POSIX).
Restore with `mv NAME.gpudoctor.bak NAME`.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass

BACKUP_SUFFIX = ".gpudoctor.bak"


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


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def real_target(path: str) -> str:
    """The file to write: path itself, or its symlink target when that stays in path's directory."""
    if not os.path.islink(path):
        return path
    home = os.path.realpath(os.path.dirname(os.path.abspath(path)))
    target = os.path.realpath(path)
    if os.path.dirname(target) != home:
        raise WriteRefused(
            f"{path}: a symlink to {target}, outside its own directory; gpudoctor edits only files there"
        )
    return target


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
    if digest(now) != digest(p.original):
        raise WriteRefused(f"{p.path}: changed since gpudoctor read it; run gpudoctor fix again")
    directory = os.path.dirname(os.path.abspath(target))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise WriteRefused(
            f"{p.path}: its directory {directory} is not writable (the backup and the new file go there)"
        )
    return target


def backup_name(target: str) -> str:
    name = target + BACKUP_SUFFIX
    n = 1
    while os.path.lexists(name):
        name = f"{target}{BACKUP_SUFFIX}.{n}"
        n += 1
    return name


def _write_new(target: str, data: bytes, like: os.stat_result) -> None:
    directory = os.path.dirname(os.path.abspath(target))
    fd, tmp = tempfile.mkstemp(prefix=".gpudoctor-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, stat.S_IMODE(like.st_mode))
        if (like.st_uid, like.st_gid) != (os.geteuid(), os.getegid()):
            try:
                os.chown(tmp, like.st_uid, like.st_gid)
            except PermissionError:
                pass  # not ours to give away: the mode is kept, the owner becomes the writer
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_all(planned: list[Planned]) -> dict[str, str]:
    """Write every planned file (after checking all of them); returns {path: backup path}."""
    targets = [(p, _check(p)) for p in planned if p.new_bytes != p.original]
    backups: dict[str, str] = {}
    for p, target in targets:
        st = os.stat(target)
        backup = backup_name(target)
        _write_new(backup, p.original, st)
        _write_new(target, p.new_bytes, st)
        backups[p.path] = backup
    return backups


def write_env_file(path: str, text: str) -> str | None:
    """--env-file: written atomically; an existing file is backed up first. Returns the backup path."""
    target = real_target(path)
    data = text.encode("utf-8")
    if os.path.exists(target):
        st = os.stat(target)
        if not stat.S_ISREG(st.st_mode):
            raise WriteRefused(f"--env-file {path}: not a regular file")
        with open(target, "rb") as fh:
            old = fh.read()
        if old == data:
            return None
        backup = backup_name(target)
        _write_new(backup, old, st)
        _write_new(target, data, st)
        return backup
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        raise WriteRefused(f"--env-file {path}: no directory {directory}")
    fd, tmp = tempfile.mkstemp(prefix=".gpudoctor-", dir=directory)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o644 & ~_umask())
    os.replace(tmp, target)
    return None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
