"""The URL of a meter on the network (``ptd://``, ``remote://``), read strictly: one line naming the fix, or a host.

A URL is typed by a user or pasted from a script; anything this module lets
through is connected to, so it is checked whole: printable ASCII of a sane
length, the scheme asked for, a host name or IP literal (no user, password,
path or fragment), a port from 1 to 65535, and only the query keys the meter
reads, each once.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import parse_qs, urlsplit

from tuner.errors import UserError

MAX_URL = 2048
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")


def peer_url(url: str, scheme: str, default_port: int, keys: set[str], usage: str) -> tuple[str, int, dict[str, str]]:
    """``(host, port, query)`` of ``scheme://HOST[:PORT][?key=value...]``; anything else is a :class:`UserError`."""
    shown = repr(url[:80]) if len(url) > 80 or not url.isprintable() else url

    def refuse(why: str) -> UserError:
        return UserError(f"cannot read --meter {shown}: {why}; {usage}")

    if len(url) > MAX_URL or not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise refuse(f"a URL is printable ASCII without spaces, at most {MAX_URL} characters")
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query), max_num_fields=16)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    if parts.scheme != scheme or not host:
        raise refuse(f"it must start {scheme}://HOST")
    if parts.username is not None or parts.password is not None or parts.path not in ("", "/") or parts.fragment:
        raise refuse("it holds only a host, a port and options (no user, password, path or fragment)")
    if port == 0:
        raise refuse("the port must be from 1 to 65535")
    if not _is_host(host):
        raise refuse(f"{host[:60]!r} is not a host name or an IP address")
    named = f"[{host}]" if ":" in host else host
    if parts.netloc.lower() not in (named.lower(), f"{named}:{port}".lower()):
        raise refuse(f"{parts.netloc[:60]!r} is not HOST or HOST:PORT")
    unknown = sorted(set(query) - keys)
    if unknown:
        known = ", ".join(sorted(keys)) or "none"
        raise refuse(f"unknown option {unknown[0][:40]!r} (known: {known})")
    repeated = sorted(k for k, v in query.items() if len(v) > 1)
    if repeated:
        raise refuse(f"option {repeated[0]!r} is given twice")
    return host, port or default_port, {k: v[0] for k, v in query.items()}


def _is_host(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return len(host) <= 253 and _HOST_NAME.fullmatch(host) is not None
