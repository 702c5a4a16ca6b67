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
  the nvpmodel clock caps including the DLAs' ``clk_cap/dla<n>_core`` (and L4T 32 Xavier's ``nafll_dla``), the
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
- Limits clamp as the kernel resolves them (L4T 35/36): a devfreq
  ``max_freq`` below ``min_freq`` is taken, and ``min_freq`` then reads back
  as the max (drivers/devfreq/devfreq.c get_freq_range: "max_freq takes
  precedence over min_freq"; the stores only update a PM QoS request); a
  cpufreq ``scaling_max_freq`` below ``scaling_min_freq`` pulls the min down
  with it (cpufreq_set_policy resolves the QoS min/max, the driver's verify
  clamps min into [.., max]) and a value off the table resolves to a table
  entry (``__resolve_freq``: the highest at or below for max, the lowest at or
  above for min). The request is kept: raising the max again brings the min
  back. L4T 32's 4.9 kernel refuses a crossing write instead (EINVAL:
  devfreq max_freq_store "value < min", cpufreq_set_policy "new_policy->max <
  policy->min"), which is what a board whose nv_tegra_release says R32 does.
- The clocks that run (devfreq ``cur_freq``, cpufreq ``scaling_cur_freq``, the
  BPMP debugfs ``gpusysclk``/``nafll_dla*`` rates) follow the limits, at the
  top of the range as under load, unless the board is throttled
  (:func:`throttle`): soctherm's thermal and over-current throttling slows
  the clocks beneath the limits, which still read back as written.
- A thermal cap through a cooling device (:func:`thermal_cap`) lowers what the
  limits read back, unlike soctherm's throttling: the kernel's devfreq and
  cpufreq cooling devices (drivers/thermal/devfreq_cooling.c, registered as
  ``devfreq-<device>``, ``thermal-devfreq-<n>`` before Linux 5.12;
  cpufreq_cooling.c, ``cpufreq-cpu<n>``) add a PM QoS / freq QoS max-frequency
  request, and ``max_freq`` (devfreq.c max_freq_show through get_freq_range) and
  ``scaling_max_freq`` (policy->max after cpufreq_set_policy) show the resolved
  value, the lowest of every request. The user's own request is kept: a store
  while capped reads back capped, and when the cap lifts (``cur_state`` back to
  0) the limit reads what the user last wrote.
- The over-current event counters (``oc<N>_event_cnt`` of the soctherm_oc
  hwmon) rise while the board is over current: each read sees the events
  since the last one (the reads are the fake's clock, so no test waits).
- A store is atomic to readers: the attribute shows the old value or the new
  one, never an empty or half-written one, even when the writer is killed
  mid-write. A plain file truncated and then written would show an empty
  value for a moment (a SIGKILL there once left one, and the next ``tune
  restore`` could not read it), so an accepted value is written aside, next
  to the tree, and renamed over the attribute.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
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
    "nafll_dla",
}
KERNEL_TREES = ("sys/", "proc/")
LIMITS = {"min_freq": "max_freq", "max_freq": "min_freq", "scaling_min_freq": "scaling_max_freq"}
LIMITS["scaling_max_freq"] = "scaling_min_freq"
STATE = "etc/fake-nvpmodel"
BPMP = "sys/kernel/debug/bpmp/debug/clk"
_OC = re.compile(r"oc\d+_event_cnt")
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
    if not writing and dir_fd is None and _OC.fullmatch(os.path.basename(os.fspath(path))):
        _count_oc(os.fspath(path))
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
    if name in LIMITS and _l4t32(root) and _crosses(path, name, int(value)):
        raise _refuse(errno.EINVAL, path)
    tmp = os.path.join(os.path.dirname(root), f".fakekernel-{os.getpid()}-{fd}.tmp")
    tmp_fd = _real_open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, os.stat(path).st_mode & 0o7777)
    try:
        written = _real_write(tmp_fd, data)
    finally:
        _real_close(tmp_fd)
    os.replace(tmp, path)
    if name in LIMITS:
        _clamp(root, path, _capped_store(root, path, int(value)))
    if name in LIMITS or name in ("dla0_core", "dla1_core", "nafll_dla"):
        settle(Path(root))
    return written


def _close(fd):  # type: ignore[no-untyped-def]
    _FDS.pop(fd, None)
    return _real_close(fd)


def register_from_environment() -> None:
    """For ``sitecustomize``: register every tree FAKE_KERNEL_ROOTS names (os.pathsep-separated)."""
    for root in filter(None, os.environ.get("FAKE_KERNEL_ROOTS", "").split(os.pathsep)):
        register(Path(root))


# -- limits, running clocks and throttling (see the module docstring) -------------------------------


def _put(path: str | Path, value: object) -> None:
    """Write a file the kernel changes by itself, atomically (temporary name, then rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.fakekernel")
    tmp.write_text(f"{value}\n")
    if path.exists():
        os.chmod(tmp, path.stat().st_mode & 0o7777)  # the attribute keeps its mode
    os.replace(tmp, path)


def _l4t32(root: str) -> bool:
    release = os.path.join(root, "etc/nv_tegra_release")
    return os.path.exists(release) and _read(release).startswith("# R32")


def _crosses(path: str, name: str, value: int) -> bool:
    other = os.path.join(os.path.dirname(path), LIMITS[name])
    if not os.path.exists(other):
        return False
    partner = int(_read(other))
    return value < partner if "max" in name else value > partner


def _table(folder: str) -> list[int]:
    for listing in ("available_frequencies", "scaling_available_frequencies"):
        found = os.path.join(folder, listing)
        if os.path.exists(found):
            return sorted(int(v) for v in _read(found).split())
    return []


def _requests(root: str) -> tuple[Path, dict[str, int]]:
    store = Path(root) / STATE / "requests.json"
    return store, json.loads(store.read_text()) if store.exists() else {}


def _clamp(root: str, path: str, value: int) -> None:
    """Resolve a limit pair after a store: the max wins, a clamped min's request is kept (module docstring).

    Only the min is ever clamped, so only its request is remembered, and only while it differs
    from what the min reads back; a pair that never crossed leaves nothing behind.
    """
    folder, name = os.path.dirname(path), os.path.basename(path)
    other = os.path.join(folder, LIMITS[name])
    if not os.path.exists(other):
        return
    lo_path, hi_path = (path, other) if "min" in name else (other, path)
    store, requests = _requests(root)
    key = os.path.relpath(lo_path, root)
    table = _table(folder) if name.startswith("scaling_") else []
    hi = int(_read(hi_path))
    if table and hi_path == path:
        hi = max([f for f in table if f <= hi], default=table[0])  # __resolve_freq, CPUFREQ_RELATION_H
    wanted = value if lo_path == path else requests.get(key, int(_read(lo_path)))
    if table:
        wanted = min([f for f in table if f >= wanted], default=table[-1])  # CPUFREQ_RELATION_L
    lo = min(wanted, hi)
    for target, number in ((hi_path, hi), (lo_path, lo)):
        if int(_read(target)) != number:
            _put(target, number)
    if lo != wanted:
        requests[key] = wanted
    else:
        requests.pop(key, None)
    if store.parent.is_dir():
        _put(store, json.dumps(requests))  # atomically: a writer killed here leaves the old requests


def _caps(root: str | Path) -> tuple[Path, dict]:
    store = Path(root) / STATE / "thermal_cap.json"
    return store, json.loads(store.read_text()) if store.exists() else {"caps": {}, "requests": {}}


def _capped_store(root: str, path: str, value: int) -> int:
    """A max limit stored while a cooling device caps it: the request is kept, the capped value shows."""
    store, state = _caps(root)
    rel = os.path.relpath(path, root)
    if rel not in state["caps"]:
        return value
    state["requests"][rel] = value
    _put(store, json.dumps(state))
    shown = min(value, state["caps"][rel])
    _put(path, shown)
    return shown


def thermal_cap(root: Path, gpu_hz: int | None = None, cpu_khz: int | None = None) -> None:
    """Cap (or, with no value, uncap) the GPU devfreq max and every cpufreq policy's max, as a cooling device does.

    The cooling devices laid out by the fake board show ``cur_state`` 1 while they cap, 0 otherwise.
    """
    root = Path(root)
    conf = json.loads((root / STATE / "fake.json").read_text())
    store, state = _caps(root)
    wanted = {f"{conf['devfreq']}/max_freq": gpu_hz}
    for cpu in conf["policies"]:
        wanted[f"sys/devices/system/cpu/cpufreq/policy{cpu}/scaling_max_freq"] = cpu_khz
    for rel, cap in wanted.items():
        path = root / rel
        if cap:
            request = state["requests"].setdefault(rel, int(_read(str(path))))
            state["caps"][rel] = cap
            shown = min(request, cap)
        elif rel in state["caps"]:
            del state["caps"][rel]
            shown = state["requests"].pop(rel)
        else:
            continue
        _put(store, json.dumps(state))
        _put(path, shown)
        _clamp(str(root), str(path), shown)
    for device in sorted((root / "sys/class/thermal").glob("cooling_device*")):
        kind = _read(str(device / "type"))
        on = (gpu_hz and "devfreq" in kind) or (cpu_khz and kind.startswith("cpufreq-"))
        _put(device / "cur_state", 1 if on else 0)
    settle(root)


def throttle_state(root: Path) -> dict:
    """What the board is throttled to now: ``gpu_hz``, ``cpu_khz``, ``dla_hz`` caps and ``oc_events`` per read."""
    path = Path(root) / STATE / "throttle.json"
    return json.loads(path.read_text()) if path.exists() else {}


def throttle(root: Path, **state: int | None) -> None:
    """Throttle (or, with no arguments, free) the board at ``root``; the running clocks follow at once."""
    _put(Path(root) / STATE / "throttle.json", json.dumps({k: v for k, v in state.items() if v}))
    settle(Path(root))


def _count_oc(path: str) -> None:
    found = _tree_of(path)
    if found is None or not os.path.exists(path):
        return
    step = throttle_state(Path(found[0])).get("oc_events", 0)
    if step and os.path.basename(path) == "oc3_event_cnt":
        _put(path, int(_read(path)) + step)


def settle(root: Path) -> None:
    """Set the running clocks from the limits and the throttle caps (see the module docstring)."""
    root = Path(root)
    extra = root / STATE / "fake.json"
    if not extra.exists():
        return
    conf = json.loads(extra.read_text())
    caps = throttle_state(root)

    def running(folder: Path, limit: str, cap: int | None) -> int:
        top = int(_read(str(folder / limit)))
        if cap:
            top = min(top, cap)
        table = [f for f in _table(str(folder)) if f <= top]
        return max(table) if table else top

    gpu = root / conf["devfreq"]
    gpu_hz = running(gpu, "max_freq", caps.get("gpu_hz"))
    _put(gpu / "cur_freq", gpu_hz)
    if (root / BPMP / "gpusysclk").is_dir():
        _put(root / BPMP / "gpusysclk" / "rate", gpu_hz)
    for cpu in conf["policies"]:
        policy = root / f"sys/devices/system/cpu/cpufreq/policy{cpu}"
        _put(policy / "scaling_cur_freq", running(policy, "scaling_max_freq", caps.get("cpu_khz")))
    for cap_file, clock in zip(conf.get("dla_caps", []), conf.get("dla_rates", []), strict=False):
        rate = root / BPMP / clock
        if rate.is_dir() and (root / cap_file).exists():
            hz = int(_read(str(root / cap_file)))
            _put(rate / "rate", min(hz, caps["dla_hz"]) if caps.get("dla_hz") else hz)
