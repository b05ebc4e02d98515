"""Run a command confined by the kernel:

    python -I -S tools/cage/launcher.py --write DIR ... --read PATH ... [--preload LIBS] -- COMMAND ARGS...

This process drops its capabilities, sets no-new-privileges, restricts itself with Landlock
(changes only beneath the `--write` directories and /dev/null; reads only beneath those and the
`--read` paths; no TCP) and seccomp (no sockets, io_uring or key rings; processes allowed), then
executes COMMAND in its own place: same pid, same descriptors, and the confinement inherited by
everything COMMAND starts, for good. A `--read` path that does not exist is skipped (a list of
system paths differs between machines); a `--write` directory that does not exist is an error.
`--preload` becomes COMMAND's LD_PRELOAD: a library preloaded into this launcher would already run
here, outside the cage (libfaketime makes shared memory and names it in the environment, which
the caged server could then not open).

Nothing is executed unless every step succeeded: on failure it writes `mcp-grpo cage: ...` to
stderr and exits with CAGE_FAILED (the manager shows that line in its start-up error).

Standard library only, run by path with -I -S (no site, no user paths): it starts in a few
milliseconds, and nothing outside this folder and the Python installation is imported.
"""

import os
import sys

# -I leaves this file's folder off sys.path.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import capabilities
import landlock
import seccomp

del sys.path[0]

CAGE_FAILED = 125
COMMAND_FAILED = 127
USAGE = "usage: launcher.py [--write DIR]... [--read PATH]... [--preload LIBS] -- COMMAND [ARGS...]"


def parse(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """({"--write": [...], "--read": [...], "--preload": [...]}, command) from the arguments;
    raises ValueError on a malformed line."""
    options: dict[str, list[str]] = {"--write": [], "--read": [], "--preload": []}
    position = 0
    while position < len(argv) and argv[position] != "--":
        flag = argv[position]
        if flag not in options or position + 1 >= len(argv):
            raise ValueError(f"unexpected {flag!r}; {USAGE}")
        options[flag].append(argv[position + 1])
        position += 2
    command = argv[position + 1:]
    if not command:
        raise ValueError(f"no command; {USAGE}")
    return options, command


def confine(writable: list[str], readable: list[str]) -> None:
    """Apply the cage to this process; raises OSError naming what the kernel refused."""
    for directory in writable:
        if not os.path.isdir(directory):
            raise OSError(f"the writable directory {directory!r} does not exist")
    capabilities.drop_capabilities()
    seccomp.prctl(landlock.PR_SET_NO_NEW_PRIVS, 1)
    if landlock.abi_version() < 1:
        raise OSError("this kernel has no Landlock (Linux 5.13+ with landlock among its LSMs)")
    landlock.restrict(writable, [path for path in readable if os.path.exists(path)])
    seccomp.install(os.getpid(), processes=True)


def main(argv: list[str]) -> None:
    try:
        options, command = parse(argv)
        confine(options["--write"], options["--read"])
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"mcp-grpo cage: could not confine the server: {exc}\n")
        sys.exit(CAGE_FAILED)
    if options["--preload"]:
        os.environ["LD_PRELOAD"] = " ".join(options["--preload"])
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        sys.stderr.write(f"mcp-grpo cage: could not execute {command[0]!r}: {exc}\n")
        sys.exit(COMMAND_FAILED)


if __name__ == "__main__":
    main(sys.argv[1:])
