"""Running nvpmodel: query the mode, switch to one, and see when a switch needs a reboot."""

from __future__ import annotations

import shutil
import subprocess
import time

from tuner.devices.jetson.errors import ApplyError, ModeNeedsReboot
from tuner.errors import UserError

# What nvpmodel prints when a mode needs a reboot (before its YES/yes question).
REBOOT_MARKERS = ("Reboot required for changing to this power mode", "DO YOU WANT TO REBOOT NOW")


class NvpmodelControl:
    """The nvpmodel executable run with no input (part of JetsonDevice)."""

    nvpmodel: str
    mode_timeout_s: float

    def query_mode(self) -> int:
        """The nvpmodel mode id the board is in (``nvpmodel -q``)."""
        out = self._run_nvpmodel(["-q"]).stdout
        ids = [line.strip() for line in out.splitlines() if line.strip().isdigit()]
        if not ids:
            raise ApplyError(f"cannot read the power mode from '{self.nvpmodel} -q': {out.strip()!r}")
        return int(ids[-1])

    def set_mode(self, mode_id: int) -> None:
        """``nvpmodel -m ID``, then poll ``-q`` until the board reports it.

        Some switches need a reboot (on Orin, one that changes the GPU's TPC
        mask once the GPU has run: "Golden image context is already created";
        nvpmodel then asks "DO YOU WANT TO REBOOT NOW? enter YES/yes to
        confirm"). nvpmodel runs with no input, so the question is answered
        no and the board stays in its mode; :class:`ModeNeedsReboot` says so.
        """
        self._run_nvpmodel(["-m", str(mode_id)])
        deadline = time.monotonic() + self.mode_timeout_s
        while self.query_mode() != mode_id:
            if time.monotonic() > deadline:
                raise ApplyError(
                    f"nvpmodel did not switch to mode {mode_id} within {self.mode_timeout_s:.0f} s "
                    "(some modes need a reboot; set that mode by hand first)"
                )
            time.sleep(0.1)

    def _run_nvpmodel(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        """Run nvpmodel with no input: a question it asks is answered by the end of input, that is no.

        A mode it will only enter after a reboot raises :class:`ModeNeedsReboot`
        whatever its exit status (boards differ), before any other failure.
        """
        try:
            proc = subprocess.run(
                [self.nvpmodel, *args],
                capture_output=True,
                text=True,
                stdin=subprocess.DEVNULL,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ApplyError(f"'{self.nvpmodel} {' '.join(args)}' failed: {exc}") from None
        if args[:1] == ["-m"] and any(marker in f"{proc.stdout}\n{proc.stderr}" for marker in REBOOT_MARKERS):
            raise ModeNeedsReboot(
                f"switching from nvpmodel mode {self.query_mode()} to mode {args[1]} needs a reboot: not applied, "
                f"tune never reboots a board (to tune in mode {args[1]}: sudo nvpmodel -m {args[1]}, answer yes, "
                "and run again after the reboot)"
            )
        if proc.returncode != 0:
            msg = (proc.stderr or proc.stdout).strip().splitlines()
            raise ApplyError(
                f"'{self.nvpmodel} {' '.join(args)}' exited {proc.returncode}: {msg[-1] if msg else 'no output'}"
            )
        return proc


def _find_nvpmodel(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise UserError(
            f"nvpmodel not found ({name}): install NVIDIA's nvidia-l4t-nvpmodel, "
            "or point --nvpmodel / "
            "TUNE_NVPMODEL at it"
        )
    return found
