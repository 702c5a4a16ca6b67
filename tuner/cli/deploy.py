"""tune apply, tune restore: deploy an exported mode, and undo it (or a crashed run)."""

from __future__ import annotations

import re
from pathlib import Path

import typer

from tuner.cli import common
from tuner.deploy import apply_export, load_export
from tuner.devices.journal import pending_journals, restore_pending
from tuner.devices.registry import device_name_for_kind, open_device


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


def register(app: typer.Typer) -> None:
    @app.command()
    def apply(
        config_file: Path = typer.Argument(..., help="a YAML file written by tune export"),
        device: str | None = typer.Option(
            None, "--device", "-d", help="device to apply to (default: the export's own device)"
        ),
        dry_run: bool = typer.Option(False, "--dry-run", help="print every write and change nothing"),
        allow_clock_changes: bool = common.ClockOpt,
        sysfs_root: Path | None = common.SysfsOpt,
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Apply an exported best mode at deploy time (idempotent; undo with tune restore)."""
        exported = load_export(config_file)
        name = device or default_device(exported.device, exported.device_kind)
        options = {"sysfs_root": sysfs_root} if sysfs_root is not None else {}
        dev = open_device(name, allow_clock_changes=allow_clock_changes, **options)
        steps = apply_export(exported, dev, dry_run=dry_run)
        if exported.twin:
            common.err_console.print("warning: this configuration was measured on a digital twin, not on hardware")
        if as_json:
            common.emit_json(
                {"device": dev.name, "dry_run": dry_run, "writes": steps, "batch_size": exported.batch_size}
            )
            return
        verb = "would write" if dry_run else "applied"
        for step in steps:
            common.out_console.print(f"{verb}: {step}")
        if not steps:
            common.out_console.print(f"{dev.name} already runs this configuration")
        if not dry_run:
            common.out_console.print(
                f"run the model with batch size {exported.batch_size}; undo with: tune restore --device {dev.name}"
            )

    @app.command()
    def restore(
        device: str | None = typer.Option(
            None, "--device", "-d", help="device to restore (default: every journaled one)"
        ),
        sysfs_root: Path | None = common.SysfsOpt,
        as_json: bool = common.JsonOpt,
    ) -> None:
        """Put a device back as it was before tune apply or a crashed run, from the journal."""
        options = {"sysfs_root": sysfs_root} if sysfs_root is not None else {}
        names = [device] if device else [entry.device for entry in pending_journals()]
        restored = []
        for name in names:
            dev = open_device(
                name,
                allow_clock_changes=name.startswith("cuda:"),
                **(options if not name.startswith(("cuda:", "sim:", "cpu")) else {}),
            )
            if restore_pending(dev):
                restored.append(name)
        if as_json:
            common.emit_json({"restored": restored})
            return
        common.out_console.print(
            "restored: " + ", ".join(restored) if restored else "nothing to restore: no journal is pending"
        )
