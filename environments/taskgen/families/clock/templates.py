"""The clock family's requests, each in a few phrasings drawn with the rng: the current date, time
and day of the week in a place; a time of day converted between places, the difference between
them; the current time converted on, once or twice. Every answer is read from the episode's own
result (`answer_from`), where the reading says it stands."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from environments.taskgen.drafts import Draft
from environments.taskgen.families.base import Template
from environments.taskgen.wording import say

if TYPE_CHECKING:
    from environments.taskgen.families.clock.family import ClockFamily

AS_REPORTED = ("Answer with the date and time exactly as the time tool reports it (ISO format).",
               "Give the date and time exactly as the tool reports it, in ISO format.")
DATE = r"^(\d{4}-\d\d-\d\d)"


def place(zone: tuple[str, str], bare: bool) -> str:
    """A place as a request names it: by its city alone, as a person does ("Tokyo"; the model finds
    the zone), or with its IANA zone ("Tokyo (time zone Asia/Tokyo)")."""
    if bare:
        return zone[0]
    return "UTC (Etc/UTC)" if zone[0] == "UTC" else f"{zone[0]} (time zone {zone[1]})"


def _time(rng: random.Random) -> str:
    return f"{rng.randrange(24):02d}:{rng.choice((0, 15, 30, 45, rng.randrange(60))):02d}"


def clock_templates(clock: ClockFamily) -> list[Template]:
    zones = clock.zones
    style = {"bare": False}

    def _place(zone: tuple[str, str]) -> str:
        return place(zone, style["bare"])

    def styled(make):
        def make_styled(rng):
            # Half the draws name places by city alone: a user says "in Tokyo", and a model that
            # only ever copied "Asia/Tokyo" from the request never learns to find a zone itself.
            style["bare"] = rng.random() < 0.5
            return make(rng)
        make_styled.__name__ = make.__name__
        return make_styled

    now_reading = clock.now[2] if clock.now else None
    target = clock.convert[4] if clock.convert else None

    def draft(request: str, calls, answer) -> Draft | None:
        return None if answer is None else Draft("clock", "", request, calls, answer_from=answer)

    def weekday(rng):
        a = rng.choice(zones)
        return draft(say(rng, (f"What day of the week is it right now in {_place(a)}?",
                                 f"Which weekday is it at the moment in {_place(a)}?",
                                 (f"Someone in {_place(a)} asks what day it is for them today. Which day of the "
                                 "week is it?"))),
                     [clock.now_call(a[1])], now_reading.answer(1, "weekday"))

    def now(rng):
        a = rng.choice(zones)
        return draft(say(rng, (f"What is the current date and time in {_place(a)}? {rng.choice(AS_REPORTED)}",
                                 f"Tell me what time it is now in {_place(a)}. {rng.choice(AS_REPORTED)}")),
                     [clock.now_call(a[1])], now_reading.answer(1, "datetime"))

    def today(rng):
        a = rng.choice(zones)
        return draft(say(rng, (f"What is today's date in {_place(a)}? Answer as YYYY-MM-DD.",
                                 f"Which date is it right now in {_place(a)} (YYYY-MM-DD)?")),
                     [clock.now_call(a[1])], now_reading.answer(1, "datetime", DATE))

    def convert(rng):
        a, b = rng.sample(zones, 2)
        time = _time(rng)
        return draft(say(rng, ((f"It is {time} today in {_place(a)}. What date and time is that in {_place(b)}? "
                                 f"{rng.choice(AS_REPORTED)}"),
                                 (f"A meeting is set for {time} today in {_place(a)}. When is that in {_place(b)}? "
                                 f"{rng.choice(AS_REPORTED)}"))),
                     [clock.convert_call(a[1], time, b[1])], target.answer(1, "datetime"))

    def convert_weekday(rng):
        a, b = rng.sample(zones, 2)
        time = _time(rng)
        return draft(say(rng, (f"When it is {time} today in {_place(a)}, which day of the week is it in {_place(b)}?",
                                 f"Convert {time} today from {_place(a)} to {_place(b)}: what weekday is it there?")),
                     [clock.convert_call(a[1], time, b[1])], target.answer(1, "weekday"))

    def difference(rng):
        a, b = rng.sample(zones, 2)
        time = _time(rng)
        return draft(say(rng, ((f"Convert {time} today from {_place(a)} to {_place(b)}. What time difference does "
                                 "the time tool report (for example +9.0h)?"),
                                 (f"How far apart are {_place(a)} and {_place(b)} today? Convert {time} from the first "
                                 "to the second and give the difference as the tool reports it (like +9.0h)."))),
                     [clock.convert_call(a[1], time, b[1])], target.answer(1, "difference"))

    def now_convert(rng):
        a, b = rng.sample(zones, 2)
        return draft(say(rng, ((f"Look up the current time in {_place(a)}, then convert that time (hours and "
                                 f"minutes) to {_place(b)}. What date and time is it there? {rng.choice(AS_REPORTED)}"),
                                 (f"Check what time it is now in {_place(a)} and convert its hours and minutes to "
                                 f"{_place(b)}. {rng.choice(AS_REPORTED)}"))),
                     [clock.now_call(a[1]), clock.convert_call(a[1], None, b[1], 1, now_reading)],
                     target.answer(2, "datetime"))

    def now_convert_weekday(rng):
        a, b = rng.sample(zones, 2)
        return draft(say(rng, ((f"Take the current time in {_place(a)} (hours and minutes) and convert it to "
                                 f"{_place(b)}. Which day of the week is it in {b[0]} at that moment?"),
                                 (f"Read the clock in {_place(a)} now, convert those hours and minutes to {_place(b)}, "
                                 f"and tell me the weekday there."))),
                     [clock.now_call(a[1]), clock.convert_call(a[1], None, b[1], 1, now_reading)],
                     target.answer(2, "weekday"))

    def now_convert_date(rng):
        a, b = rng.sample(zones, 2)
        return draft(say(rng, ((f"Look up the current time in {_place(a)} and convert its hours and minutes to "
                                 f"{_place(b)}. Which date is it there then? Answer as YYYY-MM-DD."),
                                 (f"It is now some time in {_place(a)}: read the clock there and convert that to "
                                 f"{_place(b)}. What is the date in {b[0]} (YYYY-MM-DD)?"))),
                     [clock.now_call(a[1]), clock.convert_call(a[1], None, b[1], 1, now_reading)],
                     target.answer(2, "datetime", DATE))

    def now_difference(rng):
        a, b = rng.sample(zones, 2)
        return draft(say(rng, ((f"Read the current time in {_place(a)} and convert its hours and minutes to "
                                 f"{_place(b)}. What time difference does the tool report (for example +9.0h)?"),
                                 (f"Take the time right now in {_place(a)}, convert it to {_place(b)}, and give the "
                                 "difference between the two as the tool reports it (like -5.0h)."))),
                     [clock.now_call(a[1]), clock.convert_call(a[1], None, b[1], 1, now_reading)],
                     target.answer(2, "difference"))

    def convert_twice_weekday(rng):
        a, b, c = rng.sample(zones, 3)
        time = _time(rng)
        return draft(say(rng, ((f"Convert {time} today in {_place(a)} to {_place(b)}, then convert that hour and "
                                 f"minute on to {_place(c)}. Which day of the week is it in {c[0]} then?"),
                                 (f"A message is sent at {time} today from {_place(a)}; it is relayed via "
                                 f"{_place(b)} (convert it there) and on to {_place(c)} (convert the relayed time "
                                 f"again). Which weekday is it in {c[0]}?"))),
                     [clock.convert_call(a[1], time, b[1]), clock.convert_call(b[1], None, c[1], 1, target)],
                     target.answer(2, "weekday"))

    def convert_twice(rng):
        a, b, c = rng.sample(zones, 3)
        time = _time(rng)
        return draft(say(rng, ((f"A call starts at {time} today in {_place(a)}. Convert that to {_place(b)}, then "
                                 f"convert the converted time (hours and minutes) on to {_place(c)}. What date and "
                                 f"time is it in {c[0]}? {rng.choice(AS_REPORTED)}"),
                                 (f"Pass {time} today in {_place(a)} through {_place(b)} (convert it there, then "
                                 f"convert that hour and minute) to {_place(c)}. {rng.choice(AS_REPORTED)}"))),
                     [clock.convert_call(a[1], time, b[1]), clock.convert_call(b[1], None, c[1], 1, target)],
                     target.answer(2, "datetime"))

    def now_convert_twice(rng):
        a, b, c = rng.sample(zones, 3)
        return draft(say(rng, ((f"Look up the current time in {_place(a)}. Convert its hours and minutes to "
                                 f"{_place(b)}, then convert that result's hours and minutes to {_place(c)}. Which "
                                 f"day of the week is it in {c[0]} then?"),
                                 (f"Start from the time right now in {_place(a)}, convert it to {_place(b)}, and "
                                 f"convert that to {_place(c)} (hours and minutes each time). Which weekday is it in "
                                 f"{c[0]}?"))),
                     [clock.now_call(a[1]), clock.convert_call(a[1], None, b[1], 1, now_reading),
                      clock.convert_call(b[1], None, c[1], 2, target)], target.answer(3, "weekday"))

    made = []
    if now_reading is not None:
        made += [(weekday, 1), (now, 1), (today, 1)]
    if target is not None:
        made += [(convert, 1), (convert_weekday, 1), (difference, 1), (convert_twice, 2), (convert_twice_weekday, 2)]
    if now_reading is not None and target is not None:
        made += [(now_convert, 2), (now_convert_weekday, 2), (now_convert_date, 2), (now_difference, 2),
                 (now_convert_twice, 3)]
    return [Template(f"clock:{m.__name__}", n, styled(m)) for m, n in made]
