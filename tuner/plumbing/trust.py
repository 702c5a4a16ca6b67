"""The one rule for which files and folders this tool trusts, as root or not.

The tool runs as root and does what its inputs say (an export is applied to
the board, a policy switches it, a journal is restored, a token admits a
peer), and it writes where it is told. A file or folder is trusted when its
owner is root, this user, or the user who ran ``sudo`` (``$SUDO_UID``,
honoured only as root), and nobody else can change it:

- a file: not writable by group or others; a secret (a token file) not
  readable by them either, as ssh treats keys and authorized_keys;
- a folder: not writable by others unless it is sticky (/tmp: there nobody
  can rename or remove another's entry, the kernel's protected_symlinks
  case), and not writable by its group unless that group is root's, this
  user's or the sudo user's own.

Every check reads the stat of an already opened file descriptor where one
exists, so what was checked is what is used.
"""

from __future__ import annotations

import os
import stat

from tuner.errors import ConfigurationError


def trusted_uids() -> frozenset[int]:
    """Owners whose files this process may act on: root, itself, and (as root) the sudo user."""
    uids = {0, os.geteuid()}
    sudo = os.environ.get("SUDO_UID", "")
    if os.geteuid() == 0 and sudo.isdigit() and len(sudo) < 11:
        uids.add(int(sudo))
    return frozenset(uids)


def trusted_gids() -> frozenset[int]:
    gids = {0, os.getegid()}
    sudo = os.environ.get("SUDO_GID", "")
    if os.geteuid() == 0 and sudo.isdigit() and len(sudo) < 11:
        gids.add(int(sudo))
    return frozenset(gids)


def folder_problem(info: os.stat_result) -> str | None:
    """Why a folder cannot be trusted to hold what this tool writes or reads (None: it can)."""
    if info.st_uid not in trusted_uids():
        return f"it is owned by another user (uid {info.st_uid})"
    sticky = bool(info.st_mode & stat.S_ISVTX)
    if info.st_mode & stat.S_IWOTH and not sticky:
        return "other users can write to it"
    if info.st_mode & stat.S_IWGRP and not sticky and info.st_gid not in trusted_gids():
        return f"its group (gid {info.st_gid}) can write to it"
    return None


def folder_fix(problem: str) -> str:
    """The command that repairs a folder :func:`folder_problem` refused."""
    if "owned" in problem:
        return "chown root (or your user) on it, or use a folder you own"
    return "chmod go-w on it, or use a folder only you can write"


def file_problem(info: os.stat_result, secret: bool = False) -> str | None:
    """Why an input file cannot be trusted (None: it can); ``secret``: a token, also unreadable by others."""
    if info.st_uid not in trusted_uids():
        return f"it is owned by another user (uid {info.st_uid})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"group or other users can write to it (mode {stat.S_IMODE(info.st_mode):o})"
    if secret and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        return f"group or other users can read it (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def check_file(info: os.stat_result, path: object, what: str, secret: bool = False) -> None:
    """Refuse, in one line naming the chmod/chown fix, an input file another user could have written."""
    problem = file_problem(info, secret)
    if problem is None:
        return
    if "owned" in problem:
        fix = f"chown root {path} (or your user) if you trust its content"
    else:
        fix = f"chmod {'600' if secret else 'go-w'} {path}"
    raise ConfigurationError(f"refusing {what} {path}: {problem}, so it cannot be trusted; {fix}")
