"""What ``svc.info()`` returns: the shards, acquisitions, settings and recent events, as a dict that prints as a
table."""

from __future__ import annotations

import time
from typing import Any

from dask.utils import format_bytes


class ServiceInfo(dict):
    """``svc.info()``: a dict (shards, acquisitions, events, settings) that prints as a table."""

    def __repr__(self) -> str:
        lines = ["shards:"]
        for s in self["shards"]:
            dev = s["device"]
            lines.append(
                f"  {s['worker']:<28} {dev['kind']}:{dev['name']:<14} resident {format_bytes(s['resident_bytes']):>10}"
                f" of budget {format_bytes(s['budget']):>10}  ({len(s['acquisitions'])} acquisitions)"
            )
        lines.append("acquisitions:")
        for a in self["acquisitions"]:
            shape = "x".join(str(x) for x in a.get("shape", ()))
            lines.append(f"  {a['name']:<20} {shape:<18} {a.get('dtype', ''):<8} {format_bytes(a['nbytes']):>10}  {a['state']:<8} on {a['owner']}")
        lines.append("settings: " + ", ".join(f"{k}={v!r}" for k, v in self["settings"].items()))
        lines.append("recent events:")
        for e in self["events"][-10:]:
            details = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("time", "event"))
            lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(e['time']))} {e['event']:<14} {details}")
        return "\n".join(lines)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))
