"""The one way this tool writes files: whole or not at all, never through a link.

Every file the tool writes (results, tune.db and its lock, exports,
policies, state, logs, plots, reports, journals, LoadGen's logs) goes
through this module; tests/test_one_writer.py fails on a write elsewhere.

- The path is walked from ``/`` (a relative path from the working folder's
  real path) one folder at a time with ``O_DIRECTORY | O_NOFOLLOW`` on a
  folder descriptor, so a symbolic link in *any* component is refused, not
  followed, and each folder is checked by the trust rule
  (:func:`tuner.plumbing.trust.folder_problem`: owned by root, this user or the sudo
  user, and writable by nobody else unless sticky like /tmp). Since no
  folder on the way can be changed by another user, names later reopened
  inside it (sqlite's -wal file) are safe too.
- Missing folders are created 0755 (0700 with ``private``), never wider
  whatever the umask.
- A file is written under a fresh O_EXCL name beside the target and renamed
  onto it (a reader sees the old file or the new one); a full disk or an
  unwritable folder is a one-line :class:`UserError` with the old file intact.
- Libraries that write on their own (LoadGen, matplotlib) write into
  :func:`private_folder` (mkdtemp, 0700) or into memory, and their output
  is moved in with :func:`move_file` or :func:`write_figure`.

Public API: :func:`write_bytes`, :func:`write_text`, :func:`writing`, :func:`write_figure`,
:func:`append_line`, :func:`move_file`, :func:`ensure_folder`,
:func:`check_folder`, :func:`check_target`, :func:`create_file`,
:func:`open_lock`, :func:`write_lock_holder`, :func:`remove_file`, :func:`private_folder`,
:func:`replacing` (a temporary path for code that can only write to a path) and
:func:`undone_on_failure` (a failed command leaves no folder or lock file it created).
"""

from __future__ import annotations

import errno
import io
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from tuner.errors import UserError
from tuner.plumbing import trust

DEFAULT_UMASK = 0o022
FOLDER_MODE = 0o755
PRIVATE_MODE = 0o700
MOVE_CAP = 1 << 30
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def _umask() -> int:
    """The process umask, read without changing it (Linux shows it in /proc; elsewhere assume 022)."""
    with suppress(OSError, ValueError), open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return DEFAULT_UMASK


folder_problem = trust.folder_problem


def _write_error(path: Path, exc: OSError) -> UserError:
    reason = exc.strerror or str(exc)
    fix = "free some space" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "choose another path"
    return UserError(f"cannot write {path}: {reason}; {fix} (the old file, if any, is unchanged)")


def _components(path: Path) -> tuple[str, ...]:
    """The names from ``/`` down to ``path``, '..' resolved on names (no component may be a link)."""
    parts = Path(os.path.abspath(path)).parts
    return parts[1:]


def _refuse_entry(folder_fd: int, name: str, shown: Path) -> UserError:
    """Why ``name`` in the folder could not be opened as a folder: a link, a file, or gone."""
    try:
        info = os.lstat(name, dir_fd=folder_fd)
    except OSError as exc:
        return UserError(f"cannot use {shown}: {exc.strerror}; give another path")
    if stat.S_ISLNK(info.st_mode):
        return UserError(
            f"refusing to write through {shown}: it is a symbolic link; give the real path (realpath {shown}) "
            "or remove the link"
        )
    return UserError(f"{shown} is not a folder: give a path in a folder")


def _walk(folder: Path, create: bool, private: bool = False) -> int:
    """A descriptor of ``folder`` reached without following any link, every folder on the way trusted.

    With ``create``, missing folders are made (0755, or 0700 if ``private``);
    without, a missing one is a one-line error. The caller closes the result.
    """
    fd = os.open("/", _DIR_FLAGS)
    shown = Path("/")
    try:
        for name in _components(folder):
            shown = shown / name
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise UserError(f"cannot use {shown}: no such folder; create it or give another path") from None
                made = False
                with suppress(FileExistsError):
                    os.mkdir(name, PRIVATE_MODE, dir_fd=fd)
                    made = True
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:
                    raise _refuse_entry(fd, name, shown) from None
                if made:
                    _record(shown, folder=True)
                info = os.fstat(child)
                if info.st_uid == os.geteuid():
                    os.fchmod(child, PRIVATE_MODE if private else FOLDER_MODE)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _refuse_entry(fd, name, shown) from None
                raise
            os.close(fd)
            fd = child
            problem = trust.folder_problem(os.fstat(fd))
            if problem is not None:
                raise UserError(f"refusing to write in the folder {shown}: {problem}; {trust.folder_fix(problem)}")
        return fd
    except UserError:
        os.close(fd)
        raise
    except OSError as exc:
        os.close(fd)
        raise UserError(f"cannot write in {shown}: {exc.strerror}; give a folder you can write") from None


@contextmanager
def _folder(folder: Path, create: bool = True, private: bool = False) -> Iterator[int]:
    fd = _walk(folder, create, private)
    try:
        yield fd
    finally:
        os.close(fd)


def _split(path: Path) -> tuple[Path, str]:
    path = Path(os.path.abspath(path))
    if not path.name:
        raise UserError(f"{path} is a folder, not a file: give a file name")
    return path.parent, path.name


def ensure_folder(folder: Path, private: bool = False) -> Path:
    """``folder``, created with any missing parents (0755, or 0700 if ``private``) and checked; never via a link."""
    with _folder(Path(folder), create=True, private=private) as fd:
        if private:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid():
                raise UserError(
                    f"refusing the private folder {folder}: it is owned by another user (uid {info.st_uid}); "
                    f"chown it, or use another folder"
                )
            if stat.S_IMODE(info.st_mode) != PRIVATE_MODE:
                os.fchmod(fd, PRIVATE_MODE)
    return Path(folder)


def check_folder(folder: Path, what: str = "folder") -> None:
    """Refuse, in one line, a folder that is missing, reached through a link, or another user could change."""
    with _folder(Path(folder), create=False):
        pass


def write_bytes(path: Path, data: bytes, mode: int | None = None, sync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically, creating its folder; ``sync`` flushes file and folder to disk.

    ``mode`` defaults to what a plain ``open()`` would give (0666 less the umask).
    """
    path = Path(path)
    parent, name = _split(path)
    with _folder(parent) as dir_fd:
        with suppress(FileNotFoundError):
            if stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
                raise UserError(f"{path} is a folder, not a file: give a file name")
        tmp = f".{name[:64]}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(tmp, _NEW_FLAGS, 0o600, dir_fd=dir_fd)
        except OSError as exc:
            raise _write_error(path, exc) from None
        try:
            os.fchmod(fd, (0o666 & ~_umask()) if mode is None else mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                if sync:
                    os.fsync(fh.fileno())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            if sync:
                os.fsync(dir_fd)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise _write_error(path, exc) from None
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise


def write_text(path: Path, text: str, mode: int | None = None, sync: bool = False) -> None:
    """``path.write_text(text)``, atomically and never through a link (see :func:`write_bytes`)."""
    write_bytes(path, text.encode(), mode, sync)


def write_figure(path: Path, fig: Any, **savefig: Any) -> None:
    """A matplotlib figure rendered in memory (format from the suffix) and written with :func:`write_bytes`."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".").lower() or "png", **savefig)
    write_bytes(path, buffer.getvalue())


@contextmanager
def writing(path: Path, mode: int | None = None) -> Iterator[io.StringIO]:
    """A text buffer (``csv.writer`` takes it) written to ``path`` by :func:`write_text` when the block ends."""
    buffer = io.StringIO(newline="")
    yield buffer
    write_text(path, buffer.getvalue(), mode)


def append_line(path: Path, line: str) -> None:
    """Append one line to a log of this user's, created if missing: never through a link, never cut.

    A write the disk cannot take whole (ENOSPC) is undone (the file is cut
    back to where it was), so a JSON-lines log never holds half a line.
    """
    path = Path(path)
    parent, name = _split(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with _folder(parent) as dir_fd:
        try:
            fd = os.open(name, flags, 0o666 & ~_umask(), dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UserError(f"refusing to write {path}: it is a symbolic link; remove it") from None
            raise _write_error(path, exc) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
                raise UserError(
                    f"refusing to write {path}: not a plain file of this user's (a device, a pipe, a hard link?); "
                    "remove it or give another path"
                )
            data = (line.rstrip("\n") + "\n").encode()
            try:
                written = os.write(fd, data)
                if written != len(data):
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            except OSError:
                with suppress(OSError):
                    os.ftruncate(fd, info.st_size)
                raise
        except OSError as exc:
            raise _write_error(path, exc) from None
        finally:
            os.close(fd)


def create_file(path: Path, what: str, mode: int = 0o644) -> None:
    """Make sure ``path`` is a trusted regular file, created empty if missing (a database another library opens)."""
    path = Path(path)
    parent, name = _split(path)
    with _folder(parent) as dir_fd:
        try:
            fd = os.open(
                name, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode, dir_fd=dir_fd
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UserError(f"refusing {what} {path}: it is a symbolic link; give the real path") from None
            raise _write_error(path, exc) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise UserError(f"{what} {path} is not a regular file (a folder, a pipe or a device?): check the path")
            trust.check_file(info, path, what)
        finally:
            os.close(fd)


def open_lock(path: Path) -> int:
    """A descriptor of the lock file ``path`` (created 0600 if missing), for flock; the caller closes it.

    The caller checks after taking the flock that the file is still linked
    (:func:`lock_is_live`): a failed command removes a lock file it created.
    """
    path = Path(path)
    parent, name = _split(path)
    flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    with _folder(parent) as dir_fd:
        try:
            try:
                fd = os.open(name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=dir_fd)
                _record(Path(os.path.abspath(path)), folder=False)
            except FileExistsError:
                fd = os.open(name, flags, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UserError(f"refusing the lock file {path}: it is a symbolic link; remove it") from None
            raise _write_error(path, exc) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid not in trust.trusted_uids():
        os.close(fd)
        raise UserError(f"refusing the lock file {path}: not a plain file of this user's; remove it")
    return fd


def lock_is_live(fd: int) -> bool:
    """Whether a locked file is still linked (not removed by a command that created it and then failed)."""
    return os.fstat(fd).st_nlink > 0


def write_lock_holder(fd: int, path: Path, data: bytes) -> None:
    """Replace the content of a held lock file with ``data`` (who holds it); a full disk is one line."""
    try:
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        if os.write(fd, data) != len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    except OSError as exc:
        with suppress(OSError):
            os.ftruncate(fd, 0)
        raise _write_error(Path(path), exc) from None


_scopes: list[list[tuple[Path, bool]]] = []


def _record(path: Path, folder: bool) -> None:
    if _scopes:
        _scopes[-1].append((path, folder))


@contextmanager
def undone_on_failure() -> Iterator[None]:
    """Folders and lock files this block created are removed again if it fails, so a refusal leaves nothing.

    Only what is still empty goes (a folder with anything in it, a lock file
    with a holder's record, stays); each is reached as a write is (no link).
    """
    created: list[tuple[Path, bool]] = []
    _scopes.append(created)
    try:
        yield
    except BaseException:
        for path, folder in reversed(created):
            with suppress(OSError, UserError):
                _remove_empty(path, folder)
        raise
    finally:
        _scopes.remove(created)


def _remove_empty(path: Path, folder: bool) -> None:
    with _folder(path.parent, create=False) as dir_fd:
        if folder:
            os.rmdir(path.name, dir_fd=dir_fd)
            return
        info = os.lstat(path.name, dir_fd=dir_fd)
        if stat.S_ISREG(info.st_mode) and info.st_size == 0 and info.st_uid == os.geteuid():
            os.unlink(path.name, dir_fd=dir_fd)


def move_file(source: Path, dest: Path) -> None:
    """Copy a file from a :func:`private_folder` to ``dest`` through :func:`write_bytes` (then remove it)."""
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UserError(f"cannot read {source}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise UserError(f"{source} is not a regular file")
        data = fh.read(MOVE_CAP)
    write_bytes(dest, data)
    with suppress(OSError):
        os.unlink(source)


def remove_file(path: Path) -> None:
    """Remove the file ``path`` (gone already is fine), reached as a write is: no link, trusted folders."""
    parent, name = _split(Path(path))
    if not os.path.lexists(parent):
        return
    with _folder(parent, create=False) as dir_fd:
        try:
            os.unlink(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UserError(f"cannot remove {path}: {exc.strerror}; remove it by hand") from None


def kept_private_folder(prefix: str = "powertune-") -> Path:
    """A fresh folder only this user can enter (mkdtemp, 0700) in the temporary folder, left for the user."""
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextmanager
def private_folder(prefix: str = "powertune-") -> Iterator[Path]:
    """A fresh folder only this process's user can enter (mkdtemp, 0700), removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def replacing(path: Path, mode: int | None = None) -> Iterator[Path]:
    """A temporary path (same name, in a private folder) for code that can only write to a path.

    When the block ends normally its content is written onto ``path`` with
    :func:`write_bytes`; on any error or interruption ``path`` is left as it was.
    """
    path = Path(path)
    with private_folder() as folder:
        tmp = folder / path.name
        yield tmp
        try:
            data = tmp.read_bytes()
        except OSError as exc:
            raise _write_error(path, exc) from None
        write_bytes(path, data, mode)


def check_space(path: Path, need: int, flag: str) -> None:
    """Before any work: the disk that ``path`` (a file, maybe not there yet) would be on has ``need`` bytes free.

    For what another library writes in pieces (SQLite's schema): a full
    disk found half-way would leave a cut file behind.
    """
    path = Path(os.path.abspath(path))
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), Path("/"))
    try:
        info = os.statvfs(existing)
    except OSError:
        return
    free = info.f_bavail * info.f_frsize
    if free < need:
        raise UserError(
            f"{flag} {path}: no space left on device ({free >> 10} KiB free, {need >> 10} KiB needed); free some space"
        )


def check_target(path: Path, flag: str) -> None:
    """Before any work: the file ``path`` can be written here by this module (see :func:`check_writable`)."""
    _check_writable(Path(os.path.abspath(path)), flag, is_file=True)


def check_writable(folder: Path, flag: str) -> None:
    """Before any work: files can be written in ``folder`` (created later where missing) by this module.

    The folders that exist on its way are walked and checked as a write
    would (no link, trusted), and the nearest existing one must take a new
    file: a temporary one is created there and removed at once, which
    catches what permission bits do not show (a read-only mount, /sys, /proc).
    """
    _check_writable(Path(os.path.abspath(folder)) / ".tune-probe", flag, is_file=False)


def _check_writable(path: Path, flag: str, is_file: bool) -> None:
    existing = next((p for p in path.parents if os.path.lexists(p)), Path("/"))
    shown = path if is_file else path.parent
    try:
        with _folder(existing, create=False) as dir_fd:
            if is_file and existing == path.parent:
                with suppress(FileNotFoundError):
                    if not stat.S_ISREG(os.lstat(path.name, dir_fd=dir_fd).st_mode):
                        raise UserError(
                            f"{flag} {path} is a link or not a regular file: remove it or give another path"
                        )
            probe = f".tune-probe.{secrets.token_hex(6)}"
            try:
                fd = os.open(probe, _NEW_FLAGS, 0o600, dir_fd=dir_fd)
            except OSError as exc:
                raise UserError(
                    f"{flag} {shown}: cannot write in {existing} ({exc.strerror}): give a path you can write"
                ) from None
            os.close(fd)
            os.unlink(probe, dir_fd=dir_fd)
    except UserError as exc:
        message = str(exc)
        raise UserError(message if message.startswith(flag) else f"{flag}: {message}") from None
