"""tune apply, tune restore: deploy an exported mode, and undo it (or a crashed run)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from tuner.cli import common, options
from tuner.cli.root import exit_code
from tuner.deploy import DeployPlan, ExportedConfig, apply_export, apply_hand, load_export
from tuner.devices.hardware_session import restore_device
from tuner.devices.journal import journal_files, load_journal
from tuner.devices.registry import builtin_device_name, device_name_for_kind, open_device
from tuner.errors import DeviceRefused, UserError
from tuner.plumbing import interrupts

ConfigFile = typer.Argument(None, help="a YAML file written by tune export (or --set for a hand-chosen mode)")
HandSet = typer.Option(
    [],
    "--set",
    help="apply a hand-chosen mode instead of an export: knob=value (repeatable), checked against the device's "
    "tables, journaled, undone with tune restore; other knobs keep their default; needs --device",
)
ApplyDevice = typer.Option(None, "--device", "-d", help="device to apply to (default: the export's own device)")
DryRun = typer.Option(False, "--dry-run", help="print every write and change nothing")
Persist = typer.Option(
    False, "--persist", help="Jetson: keep the mode across reboots (a custom nvpmodel mode, made the default)"
)
RestorePersist = typer.Option(
    False, "--persist", help="also remove a mode made persistent by tune apply --persist (edits /etc/nvpmodel)"
)
RestoreDevice = typer.Option(None, "--device", "-d", help="device to restore (default: every journaled one)")


def default_device(exported_device: str, kind: str) -> str:
    """The device an export is applied to unless --device says otherwise: the one it was tuned on.

    Only built-in names are taken from the file (a twin, a Jetson board, an
    NVIDIA GPU, the CPU): a ``py:`` plugin named in a file would run that
    file's code, so plugins are always named on the command line.
    """
    from tuner.devices.jetson import DEVICE_KINDS

    if exported_device.startswith("sim:") or exported_device in DEVICE_KINDS or exported_device == "cpu":
        return exported_device
    if re.fullmatch(r"cuda:\d+", exported_device):
        return exported_device
    return device_name_for_kind(kind)


@interrupts.deferring
def apply(
    config_file: Path | None = ConfigFile,
    set_: list[str] = HandSet,
    device: str | None = ApplyDevice,
    dry_run: bool = DryRun,
    persist: bool = Persist,
    allow_clock_changes: bool = options.AllowClockChanges,
    sysfs_root: Path | None = options.SysfsRoot,
    as_json: bool = options.Json,
) -> None:
    """Apply an exported best mode, or a hand-chosen one with --set, at deploy time (undo with tune restore)."""
    if set_ or config_file is None:
        return apply_set(config_file, set_, device, dry_run, persist, allow_clock_changes, sysfs_root, as_json)
    exported = load_export(config_file)
    name = device or default_device(exported.device, exported.device_kind)
    sysfs = {"sysfs_root": sysfs_root} if sysfs_root is not None else {}
    dev = open_device(name, allow_clock_changes=allow_clock_changes, **sysfs)
    plan = apply_export(exported, dev, dry_run=dry_run, persist=persist)
    steps = plan.writes
    if exported.twin:
        common.err_console.print(
            "warning: this configuration comes from a digital twin (simulated, not measured on hardware)"
        )
    source = exported.provenance
    if as_json:
        common.emit_json(
            {
                "device": dev.name,
                "dry_run": dry_run,
                "writes": steps,
                "cannot_apply": [{"knob": k, "tuned": v, "now": n} for k, v, n in plan.cannot_apply],
                "not_locked": plan.unlocked,
                "clocks_ran": exported.metrics.get("clocks_ran"),
                "runtime": plan.runtime,
                "persisted": plan.persisted,
                "batch_size": exported.batch_size,
                "knobs": exported.knobs,
                "study": source.study,
                "trial": source.trial,
            }
        )
        return
    print_plan(exported, plan, dev.name, dry_run, dev.simulated)


def apply_set(
    config_file: Path | None,
    assignments: list[str],
    device: str | None,
    dry_run: bool,
    persist: bool,
    allow_clock_changes: bool,
    sysfs_root: Path | None,
    as_json: bool,
) -> None:
    """tune apply --set: a hand-chosen mode, applied as an export is (journaled, restorable, checked first)."""
    if config_file is not None:
        raise UserError(f"give an export ({config_file}) or --set knob=value, not both: an export is applied as sealed")
    if not assignments:
        raise UserError("tune apply needs an export (best.yaml from tune export) or --set knob=value with --device")
    if device is None:
        raise UserError("tune apply --set needs the device it writes: add --device, e.g. --device orin")
    if persist:
        raise UserError("--persist keeps an export's mode (a sealed file); a --set mode is undone with tune restore")
    sysfs = {"sysfs_root": sysfs_root} if sysfs_root is not None else {}
    dev = open_device(device, allow_clock_changes=allow_clock_changes, **sysfs)
    config, plan = apply_hand(dev, assignments, dry_run=dry_run)
    if as_json:
        common.emit_json(
            {
                "device": dev.name,
                "dry_run": dry_run,
                "writes": plan.writes,
                "knobs": config.knobs,
                "runtime": plan.runtime,
            }
        )
        return
    common.out_console.print(f"hand-chosen configuration for {dev.name}: {common.fmt(config.knobs)}")
    verb = "would write" if dry_run or dev.simulated else "applied"
    for step in plan.writes:
        common.out_console.print(f"{verb}: {step}")
    if not plan.writes:
        common.out_console.print(f"{dev.name} already runs this configuration")
    if plan.runtime:
        runtime = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in plan.runtime.items())
        common.out_console.print(f"the runtime must be given: {runtime}")
    if dev.simulated and not dry_run:
        common.out_console.print(f"{dev.name} is a digital twin: nothing was written and there is nothing to restore")
    elif not dry_run:
        common.out_console.print(f"undo with: tune restore --device {dev.name}")


def print_plan(exported: ExportedConfig, plan: DeployPlan, device: str, dry_run: bool, twin: bool) -> None:
    """What tune apply did or would do, what it cannot apply here, and what the runtime must be given.

    A digital twin holds no hardware state: its apply writes nothing and journals nothing, so it says what a
    board would get and offers no restore.
    """
    source = exported.provenance
    steps = plan.writes
    energy = exported.metrics.get("j_per_query")
    measured = f", {energy:.4g} J/query" if isinstance(energy, (int, float)) else ""
    common.out_console.print(
        f"the recommended configuration of study {source.study} (trial {source.trial}): "
        f"batch {exported.batch_size}, {common.fmt(exported.knobs)}{measured}"
    )
    verb = "would write" if dry_run or twin else "applied"
    for step in steps:
        common.out_console.print(f"{verb}: {step}")
    for knob, tuned, now in plan.cannot_apply:
        same = ": already as tuned" if now is not None and float(now) == float(tuned) else ""
        current = "unknown" if now is None else f"{float(now):g}"
        common.out_console.print(f"cannot apply (observe-only): {knob}={tuned} (the device runs {current}{same})")
    ran = exported.metrics.get("clocks_ran") or {}
    if plan.unlocked or ran.get("sm_clock") == "driver boost (not locked)":
        seen = ""
        if "sm_mhz_min" in ran and "sm_mhz_max" in ran:
            seen = f": SM {ran['sm_mhz_min']:g}-{ran['sm_mhz_max']:g} MHz, mean {ran.get('sm_mhz_mean', 0):g}"
        names = f" ({', '.join(plan.unlocked)} in the file are not applied)" if plan.unlocked else ""
        common.out_console.print(f"clocks: not locked, as measured (the driver's boost ran{seen}){names}")
    if plan.cannot_apply:
        common.out_console.print(
            "observe-only: nothing was written; an operator with the right to change the card applies those, "
            "or: tune apply --allow-clock-changes"
        )
    elif not steps:
        common.out_console.print(f"{device} already runs this configuration")
    runtime = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in plan.runtime.items())
    common.out_console.print(
        f"the runtime must be given: {runtime} (tune export --format triton|trtexec|env writes them)"
    )
    if plan.persisted and not dry_run:
        common.out_console.print(
            f"{plan.persisted} is now the board's nvpmodel default: it stays after a reboot; "
            f"undo with: tune restore --persist --device {device}"
        )
    elif twin and not dry_run:
        common.out_console.print(f"{device} is a digital twin: nothing was written and there is nothing to restore")
    elif not dry_run and not plan.cannot_apply:
        common.out_console.print(f"undo with: tune restore --device {device}")


@interrupts.deferring
def restore(
    device: str | None = RestoreDevice,
    persist: bool = RestorePersist,
    sysfs_root: Path | None = options.SysfsRoot,
    as_json: bool = options.Json,
) -> None:
    """Put a device back as it was before tune apply or a crashed run, from the journal.

    Without --device every journal is restored, each only to the built-in
    board or GPU it names (never a plugin: a journal is a file, and must
    not be able to load code); one that cannot be restored does not stop
    the others, and is reported at the end.
    """
    sysfs = {"sysfs_root": sysfs_root} if sysfs_root is not None else {}
    names, failures = ([device], []) if device else journaled_devices()
    restored = []
    exit_codes = [2]
    for name in names:
        try:
            dev = open_device(
                name,
                allow_clock_changes=name.startswith("cuda:"),
                **(sysfs if not name.startswith(("cuda:", "sim:", "cpu")) else {}),
            )
            if restore_device(dev, persist=persist):
                restored.append(name)
        except UserError as exc:
            if device:
                raise
            failures.append(str(exc))
            exit_codes.append(exit_code(exc))  # a restore that went part way (1) outranks bad input (2)
    if as_json:
        common.emit_json({"restored": restored, "failed": failures})
    elif restored or not failures:
        common.out_console.print(
            "restored: " + ", ".join(restored) if restored else "nothing to restore: no journal is pending"
        )
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise (DeviceRefused if min(exit_codes) == 1 else UserError)(failures[0] + more)


def journaled_devices() -> tuple[list[str], list[str]]:
    """The built-in devices that journals name, and a one-line reason for each journal that is refused."""
    names, failures = [], []
    for path in journal_files():
        try:
            entry = load_journal(path)
        except UserError as exc:
            failures.append(str(exc))
            continue
        if builtin_device_name(entry.device):
            names.append(entry.device)
        else:
            failures.append(
                f"journal {path} names {entry.device!r}, which is not a built-in board or GPU: nothing was "
                "restored from it; restore that device with tune restore --device NAME"
            )
    return names, failures
