"""What keeps one episode's use of a server from reaching anything else: `Containment`, the answer
of `SharedToolManager.containment(server)`, by level (docs/servers.md has the same as a table).

- `landlock`: a server with `state:` in the cage: its own copy, HOME and TMP, fresh each episode;
  writes elsewhere and every socket refused by the kernel; path arguments checked too.
- `paths`: a server with `state:` without the cage: fresh copies, path arguments checked.
- `episode_id`: a server that keeps state per episode itself (its tools take `episode_id`).
- `none`: one shared server with no per-episode state.
"""

from __future__ import annotations

from dataclasses import dataclass

from tools.cage import landlock

LEVELS = ("landlock", "paths", "episode_id", "none")


@dataclass(frozen=True)
class Containment:
    """How far one episode's calls to a server are contained."""

    disposable: bool
    """Each episode starts from a fresh state: the server has `state:`, or its tools take
    `episode_id`."""
    confined: bool
    """The OS cage applies: writes outside the episode's copy are refused, and so is the network."""
    level: str
    """`landlock`, `paths`, `episode_id` or `none` (see the module docstring)."""
    not_contained: str
    """One sentence: what this level leaves open."""


def containment(level: str) -> Containment:
    """The containment of `level` on this machine (the Landlock ABI decides a few gaps)."""
    if level == "landlock":
        abi = landlock.abi_version()
        gaps = "".join([
            "; truncating files outside it" if abi < 3 else "",
            "; signals to other processes and their abstract Unix sockets" if abi < 6 else "",
        ])
        return Containment(True, True, level, (
            "Reads of system directories, the server's own installation and the paths its arguments "
            f"or `state.readable` name{gaps}, and the CPU, memory and disk it uses, are not contained; "
            "nothing it writes outside its copy, HOME and TMP, and no connection, gets out."))
    if level == "paths":
        return Containment(True, False, level, (
            "Only arguments that the tool's schema declares as paths are kept inside the copy: SQL "
            "text, shell commands and whatever the server does with other arguments may read and "
            "write anything its user can, and reach the network."))
    if level == "episode_id":
        return Containment(True, False, level, (
            "The server keeps each episode's state apart by `episode_id` itself: nothing confines "
            "what it does with files, processes or the network."))
    if level == "none":
        return Containment(False, False, level, (
            "Nothing: one shared server whose state carries over between episodes, with whatever "
            "access its user has."))
    raise ValueError(f"unknown containment level {level!r}; one of {', '.join(LEVELS)}")
