"""Every file gpudoctor reads from or writes to a path the user names goes through here.

Reads (`read_input`) are bounded: only a regular file is read (a FIFO would block forever, /dev/zero
never ends, a directory is no input), and at most `max_bytes` of it. Writes (`write_output`: -o,
--junit, --prometheus, docs -o, snapshot -o, smoke's --save-baseline, fix --apply and --env-file) never
destroy what the path is: a character device or FIFO (/dev/null, /dev/stdout, a pipe) is written
through like a shell redirect, a block device, socket or directory is refused; only a regular file is
replaced, atomically (temporary file + rename in the target's directory), keeping its mode, so no
half-written file is ever left behind.

Symlinks, one rule for every writer (`link_target`): a link named as the output is followed when its
final target lies in the link's own directory (`latest.json -> run-42.json`); the link stays a link and
its target is written. A link that leads out of its directory is refused, nothing written: that is the
shape of a symlink attack (a checked-out pull request holding `junit.xml -> ~/.bashrc`, a link planted in
a shared or world-writable directory), and the write would replace a file the user never named. Links
among the directories of the path are resolved first (a node_exporter textfile directory that is itself
a symlink works), and the magic links of open descriptors (/dev/stdout, /dev/fd/N) are written through.
Both raise FileIOError with one line naming the option and the path (the CLI turns it into exit 2).

Writers of one file, one at a time (`exclusive`): a write that must find the bytes it planned from (`expect`,
`fix --apply`) holds an exclusive lock (flock(2), non-blocking) on the file it changes from the check of those
bytes to the rename; a second writer finds the lock taken and backs off with one line, exit 2, nothing written
("another gpudoctor is writing it now"), and a writer that locked the file only after the first one renamed
a new one over it finds its path names another file ("changed since gpudoctor read it"). So one change never
leaves two backups. Temporary files are named `.gpudoctor-HOST.PID.XXXXXXXX.tmp` (the writer's host and pid);
each replacing write first removes the ones in its directory that this host's dead processes left (a writer
killed by SIGKILL between its temporary file and its rename): only that pattern, only this user's regular
files, only where no process of that pid lives (`sweep_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import socket
import stat
import tempfile
from collections.abc import Iterator

DEFAULT_MAX_BYTES = 16 * 2**20  # a snapshot, a config or a batch script is kilobytes; 16 MiB is far past any real one


class FileIOError(OSError):
    """A path that cannot be read or written as asked: one clear line (str(e)), exit 2."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _label(what: str, path: str) -> str:
    return f"{what} {path}" if what else path


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def read_input_bytes(path: str, what: str = "", max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of the regular file at path (symlinks followed), at most max_bytes.

    Opened non-blocking so that a FIFO cannot block the open; its type is checked on the open
    descriptor (no race with a swapped path). Raises FileIOError with one line.
    """
    label = _label(what, path)
    fd, st = _open_regular(path, label)
    try:
        if st.st_size > max_bytes:
            raise FileIOError(f"{label}: {st.st_size:,} bytes, over the {_size(max_bytes)} limit; refused")
        chunks: list[bytes] = []
        size = 0
        while size <= max_bytes:  # st_size can lie (/proc files, a file still growing): count what is read
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > max_bytes:
            raise FileIOError(f"{label}: over the {_size(max_bytes)} limit; refused")
        return b"".join(chunks)
    except FileIOError:
        raise
    except OSError as e:
        raise FileIOError(f"{label}: cannot read ({_reason(e)})") from None
    finally:
        os.close(fd)


def open_input_stream(path: str, what: str = ""):
    """The regular file at path opened for reading in binary, for a reader that streams it in bounded memory
    (a multi-GB log: `gpudoctor diagnose`); the same rules as read_input_bytes (no FIFO, device or directory,
    the type checked on the open descriptor), no size limit: the caller bounds what it keeps. The caller
    closes it. Raises FileIOError with one line."""
    fd, _ = _open_regular(path, _label(what, path))
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def _open_regular(path: str, label: str) -> tuple[int, os.stat_result]:
    """A read-only descriptor of the regular file at path and its stat, opened non-blocking so that a FIFO cannot
    block the open, its type checked on the descriptor (no race with a swapped path); FileIOError otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise FileIOError(f"{label}: no such file") from None
    except IsADirectoryError:
        raise FileIOError(f"{label}: is a directory, not a file") from None
    except OSError as e:
        raise FileIOError(f"{label}: cannot read ({_reason(e)})") from None
    except ValueError:  # an embedded NUL in the path
        raise FileIOError(f"{label}: not a valid path") from None
    try:
        st = os.fstat(fd)
    except OSError as e:
        os.close(fd)
        raise FileIOError(f"{label}: cannot read ({_reason(e)})") from None
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise FileIOError(f"{label}: is {_kind(st.st_mode)}, not a regular file; refused")
    return fd, st


def read_input(path: str, what: str = "", max_bytes: int = DEFAULT_MAX_BYTES, errors: str = "strict") -> str:
    """read_input_bytes decoded as UTF-8 (errors='strict' refuses other bytes with one line; 'replace' keeps going)."""
    data = read_input_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8", errors=errors)
    except UnicodeDecodeError as e:
        raise FileIOError(f"{_label(what, path)}: not UTF-8 text (byte {e.start})") from None


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n >= 2**20 else f"{n:,} bytes"


BACKUP_SUFFIX = ".gpudoctor.bak"


def backup_name(target: str) -> str:
    """TARGET.gpudoctor.bak, or .gpudoctor.bak.1, .2, ... when earlier backups exist: none is ever overwritten."""
    name = target + BACKUP_SUFFIX
    n = 1
    while os.path.lexists(name):
        name = f"{target}{BACKUP_SUFFIX}.{n}"
        n += 1
    return name


def _same_backup(target: str, original: bytes) -> str | None:
    """The latest backup of target when it holds exactly original (a writer killed after its backup and before
    its rename left it: the change it backs up was never made), so one change keeps one backup; else None."""
    latest, n = None, 0
    name = target + BACKUP_SUFFIX
    while os.path.lexists(name):
        latest = name
        n += 1
        name = f"{target}{BACKUP_SUFFIX}.{n}"
    if latest is None or not os.path.isfile(latest) or os.path.islink(latest):
        return None
    try:
        if os.path.getsize(latest) != len(original):
            return None
        return latest if _read_all(latest) == original else None
    except OSError:
        return None


def write_output(
    path: str, text: str | bytes, what: str = "", backup: bool = False, expect: bytes | None = None
) -> str | None:
    """Write text (str as UTF-8, or bytes) to path without ever replacing what is not a regular file.

    - a symlink (chain) is followed: its final target is written, the link stays a link;
    - a character device or FIFO is written through in place (/dev/null, /dev/stdout, a pipe with a
      reader); a FIFO with no reader is refused instead of blocking;
    - a directory, block device or socket is refused;
    - a regular file (or a new one) is written atomically: a temporary file in the target's directory,
      fsync, rename; an existing file keeps its mode and owner (the owner where the writer may give it);
      a new one gets 0666 & ~umask. A file with other hard links is rewritten in place so the links keep
      sharing it.
    expect: the bytes the caller read and planned from; the file must still hold exactly them (sha256),
    else nothing is written ("changed since gpudoctor read it").
    backup=True keeps an existing regular target as TARGET.gpudoctor.bak (numbered, never overwritten;
    the original's mode and owner) and returns that path; where the latest backup already holds exactly these
    bytes (a writer killed between its backup and its rename), that one is the backup.
    Raises FileIOError (one line) on any failure; nothing is left half-written.
    """
    label = _label(what, path)
    data = text.encode("utf-8") if isinstance(text, str) else text
    if not path:
        raise FileIOError(f"{label or repr(path)}: an empty path; name a file")
    link_target(path, label)
    try:
        target = os.path.realpath(path)
        st = os.stat(path)  # follows every link, /proc/self/fd's magic ones too
    except FileNotFoundError:
        st = None
    except ValueError as e:
        raise FileIOError(f"{label}: not a usable path ({e})") from None
    except OSError as e:
        raise FileIOError(f"{label}: cannot write ({_reason(e)})") from None
    if expect is not None:
        with exclusive([target], label):
            try:  # the file as it is now that this writer holds it
                st = os.stat(path)
            except OSError:
                st = None
            _still_as_read(target, st, expect, label)
            return _write(path, target, st, data, label, backup, expect)
    return _write(path, target, st, data, label, backup, expect)


def _write(
    path: str, target: str, st: os.stat_result | None, data: bytes, label: str, backup: bool, expect: bytes | None
) -> str | None:
    if st is not None and stat.S_ISREG(st.st_mode) and (_via_fd_link(path) or not _same_file(target, st)):
        # /dev/stdout, /dev/fd/N, /proc/self/fd/N: an open file of a shell redirection, reached only through
        # the magic link. Append to it as the shell opened it (`>` gave an empty file, `>>` keeps its text).
        _write_through(path, data, label, fifo=False, append=True)
        return None
    if st is not None and not stat.S_ISREG(st.st_mode):
        if stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode):
            _write_through(path, data, label, fifo=stat.S_ISFIFO(st.st_mode))  # path: /dev/stdout has no realpath
            return None
        raise FileIOError(f"{label}: is {_kind(st.st_mode)}; refused (give a file path)")
    backup_path = None
    if st is not None and backup:
        try:
            original = expect if expect is not None else _read_all(target)
        except OSError as e:
            raise FileIOError(f"{label}: cannot read it to keep a backup ({_reason(e)})") from None
        backup_path = _same_backup(target, original)
        if backup_path is None:
            backup_path = backup_name(target)
            _write_replacing(backup_path, original, f"{label} (its backup {backup_path})", st)
    if st is not None and st.st_nlink > 1:
        _write_in_place(target, data, label)
        return backup_path
    _write_replacing(target, data, label, st)
    return backup_path


# ---------------------------------------------------------------- one writer at a time, and its temporaries

_HELD: dict[tuple[int, int], int] = {}  # (st_dev, st_ino) -> the descriptor this process holds its lock on


@contextlib.contextmanager
def exclusive(targets: list[str], label: str = "") -> Iterator[None]:
    """Hold an exclusive lock on each existing regular file of targets (symlinks already resolved: the files
    written) for the block; FileIOError, one line, when another process holds one (nothing is written). A
    file this process already holds is not locked again (flock's locks of two descriptors would collide); a
    file system without flock (ENOLCK, EOPNOTSUPP) is written unlocked, as before."""
    taken: list[tuple[int, int]] = []
    try:
        for target in targets:
            key = _lock(target, label or target)
            if key is not None:
                taken.append(key)
        yield
    finally:
        for key in taken:
            fd = _HELD.pop(key, None)
            if fd is not None:
                os.close(fd)  # closing the descriptor releases its flock


def _lock(target: str, label: str) -> tuple[int, int] | None:
    try:
        fd = os.open(target, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None  # not there (a new file) or unreadable: the write itself says why
    try:
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        if not stat.S_ISREG(st.st_mode) or key in _HELD:
            os.close(fd)
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise FileIOError(
                f"{label}: another gpudoctor is writing it now; nothing written, run it again when that one is done"
            ) from None
        except OSError:
            os.close(fd)
            return None
        if not _same_file(target, st):  # a writer renamed a new file over it while this one waited to lock
            os.close(fd)
            raise FileIOError(f"{label}: changed since gpudoctor read it; run gpudoctor fix again")
    except BaseException:
        if fd not in _HELD.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    _HELD[key] = fd
    return key


def _host_tag() -> str:
    return re.sub(r"[^A-Za-z0-9-]", "", socket.gethostname())[:32]


def temporary_prefix() -> str:
    """The name every temporary file of this process starts with: `.gpudoctor-HOST.PID.`."""
    return f".gpudoctor-{_host_tag()}.{os.getpid()}."


_TEMPORARY = re.compile(r"\.gpudoctor-([A-Za-z0-9-]{0,32})\.([0-9]{1,10})\.[a-z0-9_]{8}\.tmp")
MAX_SWEEP_ENTRIES = 10_000  # a directory is looked through this far for leftovers, no further


def sweep_temporaries(directory: str) -> list[str]:
    """Remove the temporary files a writer on this host left in directory when it died before its rename
    (SIGKILL, a power cut of the process): names of this module's pattern, this user's regular files, whose
    writer's pid is no live process here. Returns the paths removed; never raises."""
    host, uid, removed = _host_tag(), os.geteuid(), []
    try:
        with os.scandir(directory or ".") as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_SWEEP_ENTRIES:
                    break
                m = _TEMPORARY.fullmatch(entry.name)
                if not m or m.group(1) != host or _alive(int(m.group(2))):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                    if stat.S_ISREG(st.st_mode) and st.st_uid == uid:
                        os.unlink(entry.path)
                        removed.append(entry.path)
                except OSError:
                    continue
    except OSError:
        pass
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's live process, or a pid this system cannot have: left alone
    return True


def link_target(path: str, label: str = "") -> str:
    """The file a write to path changes: path itself, or, for a symlink, its final target when that lies in
    the link's own directory (directory links resolved on both sides). FileIOError for a link that leads
    out of its directory (see the module's rule); a descriptor's magic link (/dev/stdout) is path itself."""
    try:
        if not os.path.islink(path) or _via_fd_link(path):
            return path
        home = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        target = os.path.realpath(path)
    except (OSError, ValueError) as e:
        raise FileIOError(f"{label or path}: not a usable path ({e})") from None
    if os.path.dirname(target) != home:
        raise FileIOError(
            f"{label or path}: a symlink to {target}, outside its own directory; refused, nothing written "
            "(name the file itself)"
        )
    return target


def _read_all(target: str) -> bytes:
    with open(target, "rb") as fh:
        return fh.read()


def _still_as_read(target: str, st: os.stat_result | None, expect: bytes, label: str) -> None:
    if st is None or not stat.S_ISREG(st.st_mode):
        raise FileIOError(f"{label}: no longer the regular file gpudoctor read; run it again")
    try:
        now = _read_all(target)
    except OSError as e:
        raise FileIOError(f"{label}: cannot read it again before writing ({_reason(e)})") from None
    if hashlib.sha256(now).digest() != hashlib.sha256(expect).digest():
        raise FileIOError(f"{label}: changed since gpudoctor read it; run gpudoctor fix again")


_FD_LINK = re.compile(r"/proc/[^/]+/fd/\d+|/dev/fd/\d+")


def _via_fd_link(path: str) -> bool:
    """Whether path is, or links to, an open descriptor (/dev/stdout -> /proc/self/fd/1, /dev/fd/N)."""
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's own limit on a link chain
        if _FD_LINK.fullmatch(current):
            return True
        if not os.path.islink(current):
            return False
        current = os.path.normpath(os.path.join(os.path.dirname(current), os.readlink(current)))
    return False


def _same_file(target: str, st: os.stat_result) -> bool:
    try:
        return os.path.samestat(os.stat(target), st)
    except OSError:
        return False


def _write_through(target: str, data: bytes, label: str, fifo: bool, append: bool = False) -> None:
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0) | (os.O_APPEND if append else 0)
    if fifo:
        flags |= os.O_NONBLOCK  # with no reader, open fails (ENXIO) instead of blocking forever
    try:
        fd = os.open(target, flags)
    except OSError as e:
        if e.errno == errno.ENXIO and fifo:
            raise FileIOError(f"{label}: a FIFO with no reader; refused") from None
        raise FileIOError(f"{label}: cannot write ({_reason(e)})") from None
    try:
        if fifo:
            os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    except BrokenPipeError:
        raise  # the reader is gone (`-o /dev/stdout | head`): the caller ends quietly, as for stdout itself
    except OSError as e:
        raise FileIOError(f"{label}: cannot write ({_reason(e)})") from None
    finally:
        os.close(fd)


def _write_in_place(target: str, data: bytes, label: str) -> None:
    try:
        with open(target, "r+b") as fh:
            fh.truncate(0)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        raise FileIOError(f"{label}: cannot write ({_reason(e)})") from None


def _write_replacing(target: str, data: bytes, label: str, st: os.stat_result | None) -> None:
    directory = os.path.dirname(target) or "."
    sweep_temporaries(directory)
    try:
        fd, tmp = tempfile.mkstemp(prefix=temporary_prefix(), suffix=".tmp", dir=directory)
    except OSError as e:
        raise FileIOError(f"{label}: cannot write in {directory} ({_reason(e)})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if st is not None:
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            if (st.st_uid, st.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.chown(tmp, st.st_uid, st.st_gid)
                except PermissionError:
                    pass  # not ours to give away: the mode is kept, the owner becomes the writer
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise FileIOError(f"{label}: cannot write ({_reason(e)})") from None
        raise


def read_text(path: str, max_bytes: int = 1 << 20) -> str | None:
    """A small /proc or /sys file, stripped; None when it cannot be read (never blocks on a FIFO)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        size = 0
        while size < max_bytes:  # a /proc seq_file may hand its text over in several reads
            chunk = os.read(fd, max_bytes - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
