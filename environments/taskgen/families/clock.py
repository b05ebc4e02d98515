"""Time-zone servers (`get_current_time(timezone)`, `convert_time(source_timezone, time,
target_timezone)`, as PyPI's mcp-server-time offers them).

Every answer depends on today's date (the current time, and daylight saving time for a
conversion), so every task takes its answer from the episode's own result (`answer_from`):
the day of the week, or the date and time exactly as the tool writes it. Requests name each place
with its IANA zone, so no value is left to guess; a zone the server does not know is dropped
while exploring.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from environments.taskgen.drafts import Call, Draft, DraftRejected, Pick
from environments.taskgen.families.base import Explorer, Template
from environments.tasks.picks import Picked
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


def _place(zone: tuple[str, str]) -> str:
    return "UTC (Etc/UTC)" if zone[0] == "UTC" else f"{zone[0]} (time zone {zone[1]})"


def _hhmm(step: int, field: str) -> Pick:
    """HH:MM of the ISO time at `field` of call `step`'s result (get_current_time's `datetime`,
    convert_time's `target.datetime`)."""
    return Pick.of(Picked(step=step, field=field, pattern=r"T(\d\d:\d\d)"), f"the time call {step} returned (HH:MM)")


async def _known(explorer: Explorer, zone: str) -> bool:
    """The server's time-zone database has `zone` (one it lacks is left out of the requests)."""
    try:
        await explorer.call("get_current_time", {"timezone": zone})
    except DraftRejected:
        return False
    return True


_AS_REPORTED = "Answer with the date and time exactly as the time tool reports it (ISO format)."


class ClockFamily:
    name = "clock"

    def __init__(self, server: str):
        self.server = server
        self.zones: list[tuple[str, str]] = []

    async def attach(self, found, explorer: Explorer) -> set[str]:
        if not self.claims(list(explorer.specs)):
            return set()
        await self.explore(explorer)
        return set(explorer.specs)

    def claims(self, tools: Sequence[str]) -> bool:
        return {"get_current_time", "convert_time"} <= set(tools)

    async def explore(self, explorer: Explorer) -> None:
        for place, zone in ZONES:
            if await _known(explorer, zone):
                self.zones.append((place, zone))

    def _now(self, zone: str) -> Call:
        return Call(self.server, "get_current_time", {"timezone": zone})

    def _convert(self, source: str, time: str | None, target: str, step: int | None = None,
                 field: str = "datetime") -> Call:
        """A conversion of `time`, or of the time at `field` of call `step`'s result."""
        call = Call(self.server, "convert_time", {"source_timezone": source, "time": time or "",
                                                  "target_timezone": target})
        if step is not None:
            call.picks["time"] = _hhmm(step, field)
        return call

    @staticmethod
    def _time(rng: random.Random) -> str:
        return f"{rng.randrange(24):02d}:{rng.choice((0, 15, 30, 45, rng.randrange(60))):02d}"

    def templates(self) -> list[Template]:
        zones = self.zones
        if len(zones) < 3:
            return []

        def weekday(rng: random.Random) -> Draft:
            a = rng.choice(zones)
            return Draft("clock", "clock:now_weekday", f"What day of the week is it right now in {_place(a)}?",
                         [self._now(a[1])], answer_from=AnswerFrom(step=1, field="day_of_week"))

        def now(rng: random.Random) -> Draft:
            a = rng.choice(zones)
            return Draft("clock", "clock:now", f"What is the current date and time in {_place(a)}? {_AS_REPORTED}",
                         [self._now(a[1])], answer_from=AnswerFrom(step=1, field="datetime"))

        def convert(rng: random.Random) -> Draft:
            a, b = rng.sample(zones, 2)
            time = self._time(rng)
            return Draft("clock", "clock:convert",
                         f"It is {time} today in {_place(a)}. What date and time is that in {_place(b)}? "
                         f"{_AS_REPORTED}", [self._convert(a[1], time, b[1])], answer_from=AnswerFrom(step=1, field="target.datetime"))

        def difference(rng: random.Random) -> Draft:
            a, b = rng.sample(zones, 2)
            time = self._time(rng)
            return Draft("clock", "clock:difference",
                         f"Convert {time} today from {_place(a)} to {_place(b)}. What time difference does the "
                         "time tool report (for example +9.0h)?",
                         [self._convert(a[1], time, b[1])], answer_from=AnswerFrom(step=1, field="time_difference"))

        def now_convert(rng: random.Random) -> Draft:
            a, b = rng.sample(zones, 2)
            return Draft("clock", "clock:now>convert",
                         f"Look up the current time in {_place(a)}, then convert that time (hours and minutes) "
                         f"to {_place(b)}. What date and time is it there? {_AS_REPORTED}",
                         [self._now(a[1]), self._convert(a[1], None, b[1], step=1)], answer_from=AnswerFrom(step=2, field="target.datetime"))

        def now_convert_weekday(rng: random.Random) -> Draft:
            a, b = rng.sample(zones, 2)
            return Draft("clock", "clock:now>convert_weekday",
                         f"Take the current time in {_place(a)} (hours and minutes) and convert it to {_place(b)}. "
                         f"Which day of the week is it in {b[0]} at that moment?",
                         [self._now(a[1]), self._convert(a[1], None, b[1], step=1)],
                         answer_from=AnswerFrom(step=2, field="target.day_of_week"))

        def convert_twice(rng: random.Random) -> Draft:
            a, b, c = rng.sample(zones, 3)
            time = self._time(rng)
            return Draft("clock", "clock:convert>convert",
                         f"A call starts at {time} today in {_place(a)}. Convert that to {_place(b)}, then convert "
                         f"the converted time (hours and minutes) on to {_place(c)}. What date and time is it in "
                         f"{c[0]}? {_AS_REPORTED}",
                         [self._convert(a[1], time, b[1]), self._convert(b[1], None, c[1], 1, "target.datetime")],
                         answer_from=AnswerFrom(step=2, field="target.datetime"))

        def now_convert_twice(rng: random.Random) -> Draft:
            a, b, c = rng.sample(zones, 3)
            return Draft("clock", "clock:now>convert>convert",
                         f"Look up the current time in {_place(a)}. Convert its hours and minutes to {_place(b)}, "
                         f"then convert that result's hours and minutes to {_place(c)}. Which day of the week is "
                         f"it in {c[0]} then?",
                         [self._now(a[1]), self._convert(a[1], None, b[1], step=1),
                          self._convert(b[1], None, c[1], 2, "target.datetime")], answer_from=AnswerFrom(step=3, field="target.day_of_week"))

        makers = [(weekday, 1), (now, 1), (convert, 1), (difference, 1), (now_convert, 2),
                  (now_convert_weekday, 2), (convert_twice, 2), (now_convert_twice, 3)]
        return [Template(f"clock:{m.__name__}", n, m) for m, n in makers]


def family(server: str) -> ClockFamily:
    return ClockFamily(server)
