"""tune meter-serve: serve a meter on this host to a tuner on another (``--meter remote://host:port``)."""

from __future__ import annotations

import secrets
from pathlib import Path

import typer

from tuner.cli import common
from tuner.devices.meters.registry import first_reading, is_external, open_meter
from tuner.devices.meters.remote import DEFAULT_PORT, TOKEN_ENV, read_token
from tuner.devices.meters.serve import MeterServer
from tuner.errors import UserError
from tuner.measure.meters import Meter

ServedMeter = typer.Option(
    ..., "--meter", help="meter to serve: nvml-energy, rails, rapl (with --device), ptd://..., py:..., a plugin"
)
MeterDevice = typer.Option(None, "--device", "-d", help="device whose meter is served (built-in meters)")
Listen = typer.Option(
    f"127.0.0.1:{DEFAULT_PORT}", "--listen", help="address to listen on; loopback unless you name another"
)
TokenFile = typer.Option(
    None, "--token-file", help=f"file holding the shared token (default ${TOKEN_ENV}, else a new one)"
)


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise UserError(f"--listen {text}: write HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}")
    return host, int(port)


def meter_factory(meter: str, device: str | None):
    """What makes a fresh meter per window: an external meter, or a device's own meter by name."""
    if is_external(meter):
        if device is not None:
            raise UserError(f"--device does not apply to --meter {meter}: drop it")
        opened = open_meter(meter)
        if not meter.startswith(("ptd://", "remote://")):
            first_reading(meter, opened)
        return lambda: open_meter(meter)
    if device is None:
        raise UserError(f"--meter {meter} is a device's meter: name the device, e.g. --device cuda:0 --meter {meter}")
    dev = common.device(device)
    make = getattr(dev, "make_meter", None)
    if make is None:
        raise UserError(f"{device} has no meter to serve: pick another --device or a plugin --meter")
    make(meter)

    def fresh() -> Meter:
        return make(meter)

    return fresh


def meter_serve(
    meter: str = ServedMeter,
    device: str | None = MeterDevice,
    listen: str = Listen,
    token_file: Path | None = TokenFile,
) -> None:
    """Serve a local meter over TCP (named start/stop/read, token required) to a tuner on another host."""
    host, port = listen_address(listen)
    make = meter_factory(meter, device)
    if token_file is not None:
        token = read_token(str(token_file))
    else:
        try:
            token = read_token()
        except UserError:
            token = secrets.token_urlsafe(24)
            typer.echo(f"token (give it to the tuner as ${TOKEN_ENV}): {token}", err=True)
    server = MeterServer(make, token, host, port)
    shown = f"[{server.address[0]}]" if ":" in server.address[0] else server.address[0]
    typer.echo(f"serving {server.meter.name} on remote://{shown}:{server.address[1]}")
    thread = server.start_background()
    try:
        while thread.is_alive():
            thread.join(0.5)
    finally:
        server.close()
