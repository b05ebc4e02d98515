"""The clock family: any server with a tool that tells the current time in an IANA time zone, or
converts a time of day between two zones, whatever the tools and their arguments are called.

Recognised by what a call answers: a tool with one required text argument that answers
"Europe/Paris" with an ISO date and time, and fails for a zone that does not exist, tells the
current time (`now`); a tool with three required text arguments that, given Etc/UTC, 12:00 and
Asia/Tokyo in the right places, answers with 21:00 converts (`convert`: which argument is which is
found by trying the orders). Where in each result the date and time, the day of the week and the
difference between the zones stand is found by the values' shapes.

Every answer depends on the day (the current time, daylight saving time for a conversion), so
every task takes its answer from the episode's own result (`answer_from`). Requests name each
place with its IANA zone, so no value is left to guess; a zone the server does not know is left
out.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from environments.taskgen.drafts import Call, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.taskgen.families.clock.templates import clock_templates
from environments.taskgen.observe import Exploration
from environments.tasks.picks import Picked, parse_result
from environments.tasks.success import AnswerFrom

ZONES = (("Tokyo", "Asia/Tokyo"), ("Paris", "Europe/Paris"), ("New York", "America/New_York"),
         ("London", "Europe/London"), ("Sydney", "Australia/Sydney"), ("Kolkata", "Asia/Kolkata"),
         ("São Paulo", "America/Sao_Paulo"), ("Los Angeles", "America/Los_Angeles"),
         ("Chicago", "America/Chicago"), ("Berlin", "Europe/Berlin"), ("Dubai", "Asia/Dubai"),
         ("Singapore", "Asia/Singapore"), ("Johannesburg", "Africa/Johannesburg"),
         ("Auckland", "Pacific/Auckland"), ("Mexico City", "America/Mexico_City"), ("Cairo", "Africa/Cairo"),
         ("Seoul", "Asia/Seoul"), ("Toronto", "America/Toronto"), ("Honolulu", "Pacific/Honolulu"),
         ("Reykjavik", "Atlantic/Reykjavik"), ("Kathmandu", "Asia/Kathmandu"), ("UTC", "Etc/UTC"))
"""(place, IANA zone) the requests use."""
NO_ZONE = "Mars/Olympus_Mons"
"""A zone no time-zone database has: a clock tool must refuse it."""
ISO = r"\d{4}-\d\d-\d\dT\d\d:\d\d"
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_DIFFERENCE = re.compile(r"[+-]?0?9(?:[.:]0+)?\s*(?:h|hours?)?", re.IGNORECASE)
"""How a conversion from UTC to Tokyo may write the difference (+9.0h, 9, +09:00, 9 hours)."""


def _string_arguments(spec) -> list[str] | None:
    """The required arguments of a tool whose required arguments are all text."""
    schema = spec.input_schema or {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    if required and all(isinstance(props.get(r), dict) and props[r].get("type") == "string" for r in required):
        return required
    return None


def _paths(data: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted path, value) of every scalar in parsed data."""
    if isinstance(data, dict):
        return [p for key, value in data.items() for p in _paths(value, f"{prefix}{key}.")]
    if isinstance(data, list):
        return [p for i, value in enumerate(data) for p in _paths(value, f"{prefix}{i}.")]
    return [(prefix.rstrip("."), data)]


@dataclass
class Reading:
    """Where a clock's result holds each value: a dotted path into its parsed form, or (a result
    that is not data) None, the value then found by its pattern in the text."""

    datetime: str | None
    weekday: str | None
    difference: str | None = None
    data: bool = True

    def answer(self, step: int, what: str, pattern: str | None = None) -> AnswerFrom | None:
        """Where the answer `what` (datetime, weekday, difference) is in call `step`'s result."""
        path = getattr(self, what)
        if self.data:
            return None if path is None else AnswerFrom(step=step, field=path, pattern=pattern)
        shapes = {"datetime": rf"({ISO}\S*)", "weekday": rf"\b({'|'.join(WEEKDAYS)})\b", "difference": None}
        return AnswerFrom(step=step, pattern=pattern or shapes[what]) if shapes[what] else None

    def hhmm(self, step: int) -> Pick:
        """The hours and minutes of the date and time in call `step`'s result."""
        if self.data:
            spec = Picked(step=step, field=self.datetime, pattern=r"T(\d\d:\d\d)")
        else:
            spec = Picked(step=step, pattern=r"\d{4}-\d\d-\d\dT(\d\d:\d\d)")
        return Pick.of(spec, f"the time call {step} returned (HH:MM)")


def _reading(text: str, hour: str | None = None, target_prefix: str | None = None) -> Reading | None:
    """Where `text` holds an ISO date and time (at `hour` where given) and the day of the week."""
    data = parse_result(text)
    if not isinstance(data, (dict, list)):
        # Plain text: the one date and time it holds is found by its shape.
        times = re.findall(ISO, text)
        return Reading(None, None, data=False) if len(times) == 1 and (hour is None or f"T{hour}" in times[0]) \
            else None
    scalars = _paths(data)
    times = [p for p, v in scalars if isinstance(v, str) and re.match(ISO, v)
             and (hour is None or f"T{hour}" in v)]
    if len(times) != 1:
        return None
    parent = times[0].rpartition(".")[0]
    days = [p for p, v in scalars if v in WEEKDAYS and p.rpartition(".")[0] == parent]
    return Reading(times[0], days[0] if len(days) == 1 else None)


class ClockFamily:
    name = "clock"

    def __init__(self, server: str):
        self.server = server
        self.now: tuple[str, str, Reading] | None = None
        """(tool, zone argument, where its result holds what)."""
        self.convert: tuple[str, str, str, str, Reading] | None = None
        """(tool, source zone argument, time argument, target zone argument, where the target's
        values are)."""
        self.zones: list[tuple[str, str]] = []

    async def _quiet(self, explorer: Explorer, tool: str, args: dict[str, Any]) -> str | None:
        """The result of a call that changes nothing; None where it fails (or writes)."""
        return await explorer.quiet(tool, args)

    async def attach(self, found: Exploration, explorer: Explorer) -> set[str]:
        candidates = [(t, args) for t, spec in sorted(explorer.specs.items())
                      if explorer.probeable(t) and (args := _string_arguments(spec))]
        for tool, args in candidates:
            if len(args) == 1 and self.now is None:
                await self._find_now(explorer, tool, args[0])
            elif len(args) == 3 and self.convert is None:
                await self._find_convert(explorer, tool, args)
        if self.now is None and self.convert is None:
            return set()
        for place, zone in ZONES:
            if await self._known(explorer, zone):
                self.zones.append((place, zone))
        return {t for t in (self.now and self.now[0], self.convert and self.convert[0]) if t}

    async def _find_now(self, explorer: Explorer, tool: str, arg: str) -> None:
        text = await self._quiet(explorer, tool, {arg: "Europe/Paris"})
        reading = _reading(text) if text is not None else None
        if reading is None or await self._quiet(explorer, tool, {arg: NO_ZONE}) is not None:
            return
        self.now = (tool, arg, reading)
        explorer.learn(tool, False, "it tells the current time in a time zone (Europe/Paris answered an ISO date "
                       "and time, a zone that does not exist failed) and its calls changed nothing")

    async def _find_convert(self, explorer: Explorer, tool: str, args: list[str]) -> None:
        for source, time, target in itertools.permutations(args):
            text = await self._quiet(explorer, tool, {source: "Etc/UTC", time: "12:00", target: "Asia/Tokyo"})
            reading = _reading(text, "21:00") if text is not None else None
            if reading is None:
                continue
            if reading.data:
                reading.difference = next((p for p, v in _paths(parse_result(text))
                                           if p != reading.datetime and _DIFFERENCE.fullmatch(str(v).strip())), None)
            self.convert = (tool, source, time, target, reading)
            explorer.learn(tool, False, "it converts a time between time zones (12:00 from Etc/UTC to Asia/Tokyo "
                           "answered 21:00) and its calls changed nothing")
            return

    async def _known(self, explorer: Explorer, zone: str) -> bool:
        """The server's time-zone database has `zone` (one it lacks is left out of the requests)."""
        if self.now is not None:
            tool, arg, _ = self.now
            return await self._quiet(explorer, tool, {arg: zone}) is not None
        tool, source, time, target, _ = self.convert
        return await self._quiet(explorer, tool, {source: zone, time: "12:00", target: "Etc/UTC"}) is not None

    # -- calls ----------------------------------------------------------------------------------

    def now_call(self, zone: str) -> Call:
        tool, arg, _ = self.now
        return Call(self.server, tool, {arg: zone})

    def convert_call(self, source: str, time: str | None, target: str, from_step: int | None = None,
                     reading: Reading | None = None) -> Call:
        """A conversion of `time`, or of the hours and minutes call `from_step` returned (read
        as `reading` says)."""
        tool, source_arg, time_arg, target_arg, _ = self.convert
        call = Call(self.server, tool, {source_arg: source, time_arg: time or "", target_arg: target})
        if from_step is not None:
            call.picks[time_arg] = reading.hhmm(from_step)
        return call

    def templates(self) -> list[Template]:
        return clock_templates(self) if len(self.zones) >= 3 else []
