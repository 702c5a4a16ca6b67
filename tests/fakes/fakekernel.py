"""The kernel's rules for a fake Jetson sysfs tree, enforced on every ``os.open``/``os.write``.

A fake tree is plain files, and the tests run as any user (often root, for
whom file modes stop nothing), so the rules a real kernel applies to sysfs
writes are applied here instead, to every process that registers the tree
(in-process by :func:`register`, in child processes by the ``sitecustomize``
in ``fakekernel_site/`` when FAKE_KERNEL_ROOTS names the tree). Only writes
are checked; reads pass through. The rules, and where each comes from:

- A sysfs attribute without a ``store`` method cannot be opened for writing:
  EACCES even for root (kernfs_fop_open refuses FMODE_WRITE when the
  attribute has no write op). Writable here are only the attributes listed in
  ``WRITABLE`` (cpufreq limits and governor, devfreq min/max/governor, CPU
  ``online``, the GPU's ``tpc_pg_mask``/``railgate_enable``/``power/control``,
  the nvpmodel clock caps including the DLAs' ``clk_cap/dla<n>_core``, the
  bpmp debugfs EMC ``rate``/``mrq_rate_locked``).
- Nothing can be created under /sys, /proc or debugfs (kernfs directories have
  no ``create`` inode operation: EACCES).
- The limits and governor of a cpufreq policy whose CPUs are all offline are
  refused: the policy is inactive and cpufreq's ``store()`` does not call the
  attribute (drivers/cpufreq/cpufreq.c; mainline answers EINVAL before 5.19
  and EBUSY after "cpufreq: Abort show()/store() for half-initialized
  policies"; the AGX Orin probe of issue 9 saw EPERM, which is used here). Reads
  of such a policy are left working, as on L4T 35's 5.10 kernel.
- A value the attribute cannot parse is refused with EINVAL and leaves the
  attribute as it was (kstrtouint in the store methods; ``online`` takes 0/1;
  a governor must be one of ``scaling_available_governors``/``available_governors``).
  O_TRUNC therefore only takes effect once a write is accepted.
- A store is atomic to readers: the attribute shows the old value or the new
  one, never an empty or half-written one, even when the writer is killed
  mid-write. A plain file truncated and then written would show an empty
  value for a moment (a SIGKILL there once left one, and the next ``tune
  restore`` could not read it), so an accepted value is written aside, next
  to the tree, and renamed over the attribute.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

WRITABLE = {
    "scaling_min_freq",
    "scaling_max_freq",
    "scaling_governor",
    "min_freq",
    "max_freq",
    "governor",
    "online",
    "tpc_pg_mask",
    "railgate_enable",
    "control",
    "emc_iso_cap",
    "emc",
    "rate",
    "mrq_rate_locked",
    "dla0_core",
    "dla1_core",
}
KERNEL_TREES = ("sys/", "proc/")
_ROOTS: set[str] = set()
_FDS: dict[int, tuple[str, str]] = {}
_real_open = os.open
_real_write = os.write
_real_close = os.close


def register(root: Path) -> None:
    """Apply the rules to writes under ``root`` in this process (installs the hooks once)."""
    _ROOTS.add(os.path.realpath(root))
    if os.open is not _open:
        os.open = _open  # type: ignore[assignment]
        os.write = _write  # type: ignore[assignment]
        os.close = _close  # type: ignore[assignment]


def _tree_of(path: str) -> tuple[str, str] | None:
    """(root, path relative to it) when ``path`` lies in a kernel tree of a registered board."""
    real = os.path.realpath(path)
    for root in _ROOTS:
        if real.startswith(root + "/"):
            rel = real[len(root) + 1 :]
            if rel.startswith(KERNEL_TREES):
                return root, rel
    return None


def _refuse(code: int, path: str) -> OSError:
    return OSError(code, os.strerror(code), path)


def _read(path: str) -> str:
    with open(path) as fh:
        return fh.read().strip().strip("\0")


def _open(path, flags, mode=0o777, *, dir_fd=None):  # type: ignore[no-untyped-def]
    writing = flags & (os.O_WRONLY | os.O_RDWR)
    found = _tree_of(os.fspath(path)) if writing and dir_fd is None else None
    if found is None:
        return _real_open(path, flags, mode, dir_fd=dir_fd)
    root, rel = found
    if not os.path.lexists(path):
        raise _refuse(errno.EACCES if flags & os.O_CREAT else errno.ENOENT, os.fspath(path))
    if os.path.basename(rel) not in WRITABLE:
        raise _refuse(errno.EACCES, os.fspath(path))
    if os.path.basename(rel) in ("scaling_min_freq", "scaling_max_freq", "scaling_governor"):
        policy = os.path.dirname(os.path.join(root, rel))
        cpus = [int(c) for c in _read(os.path.join(policy, "related_cpus")).split()]
        cpu_base = os.path.join(root, "sys/devices/system/cpu")
        online = [c == 0 or _read(os.path.join(cpu_base, f"cpu{c}", "online")) == "1" for c in cpus]
        if not any(online):
            raise _refuse(errno.EPERM, os.fspath(path))
    fd = _real_open(path, flags & ~os.O_TRUNC, mode)
    _FDS[fd] = (root, os.path.join(root, rel))
    return fd


def _write(fd, data):  # type: ignore[no-untyped-def]
    if fd not in _FDS:
        return _real_write(fd, data)
    root, path = _FDS[fd]
    value = bytes(data).decode(errors="replace").strip()
    name = os.path.basename(path)
    if name == "online" and value not in ("0", "1"):
        raise _refuse(errno.EINVAL, path)
    if name in ("scaling_governor", "governor"):
        folder = os.path.dirname(path)
        listing = "scaling_available_governors" if name == "scaling_governor" else "available_governors"
        allowed = _read(os.path.join(folder, listing)).split() if os.path.exists(os.path.join(folder, listing)) else []
        if value not in allowed:
            raise _refuse(errno.EINVAL, path)
    elif name not in ("control",) and not value.lstrip("-").isdigit():
        raise _refuse(errno.EINVAL, path)
    tmp = os.path.join(os.path.dirname(root), f".fakekernel-{os.getpid()}-{fd}.tmp")
    tmp_fd = _real_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.stat(path).st_mode & 0o7777)
    try:
        written = _real_write(tmp_fd, data)
    finally:
        _real_close(tmp_fd)
    os.replace(tmp, path)
    return written


def _close(fd):  # type: ignore[no-untyped-def]
    _FDS.pop(fd, None)
    return _real_close(fd)


def register_from_environment() -> None:
    """For ``sitecustomize``: register every tree FAKE_KERNEL_ROOTS names (os.pathsep-separated)."""
    for root in filter(None, os.environ.get("FAKE_KERNEL_ROOTS", "").split(os.pathsep)):
        register(Path(root))
