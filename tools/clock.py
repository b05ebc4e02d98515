"""A shifted clock for the stdio servers we start (`tools.clock_offset`), through libfaketime.

libfaketime (Debian: `apt-get install faketime`) is preloaded into the server (LD_PRELOAD) and
shifts what the C library's clock calls answer by `FAKETIME` ("+1d", "-2h"); it reaches whatever
reads the time through the C library (Python, node, git) and is inherited by what the server
starts. Monotonic clocks stay real (DONT_FAKE_MONOTONIC): they measure intervals (timeouts, event
loops), not dates. A statically linked server, or one that reads the time by a raw system call,
still sees the real time. libfaketime keeps no state shared between processes here
(FAKETIME_DISABLE_SHM, where the version knows it; a caged server cannot create it anyway).
"""

from __future__ import annotations

import glob
import os
import sysconfig

LIBRARY = "libfaketime.so.1"
"""The single-threaded-clock build of libfaketime (the package's default)."""


def libfaketime() -> str | None:
    """The path of libfaketime for this machine's architecture, or None where it is not installed."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    candidates = [f"/usr/lib/{multiarch}/faketime/{LIBRARY}"] if multiarch else []
    candidates += [f"/usr/lib/faketime/{LIBRARY}", f"/usr/lib64/faketime/{LIBRARY}",
                   f"/usr/local/lib/faketime/{LIBRARY}"]
    # Another multiarch directory only where it is this machine's (x86_64-linux-gnu, aarch64-...).
    machine = os.uname().machine
    candidates += [path for path in sorted(glob.glob(f"/usr/lib/*/faketime/{LIBRARY}"))
                   if os.path.basename(os.path.dirname(os.path.dirname(path))).startswith(machine)]
    return next((path for path in candidates if os.path.isfile(path)), None)


def clock_env(offset: str, preload: str | None = None) -> dict[str, str]:
    """The variables that shift a server's clock by `offset` (`tools.clock_offset`), keeping a
    preload the server already has (`preload`) after ours. Raises OSError where libfaketime is
    not installed."""
    library = libfaketime()
    if library is None:
        raise OSError(f"tools.clock_offset {offset!r} needs libfaketime ({LIBRARY}), which is not "
                      "installed (Debian/Ubuntu: apt-get install faketime; `make install` tries it)")
    return {"LD_PRELOAD": " ".join(filter(None, [library, preload])), "FAKETIME": offset,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_DISABLE_SHM": "1"}
