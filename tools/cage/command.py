"""The command line that starts a stdio server in the cage, and what the cage lets it read.

`Cage.launch(executable, args, env, uses_our_python)` is `python -I -S launcher.py --write ...
--read ... -- executable args` and the environment to start it with. Writes: the `writable` directories (an instance's copy of its state and
its private HOME and TMP). Reads: those, SYSTEM_READABLE and RUNTIME_READABLE, the server's own
installation (`installation`), existing paths named in its arguments, and the configured
`readable` paths. `kernel_problem()` says what this machine lacks for a cage, or None.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tools.cage import landlock, seccomp

LAUNCHER = str(Path(__file__).with_name("launcher.py"))
PROJECT_ROOT = str(Path(__file__).resolve().parents[2])
"""Our bundled servers run as `python -m tools.servers.NAME` from here."""
RUNTIME_READABLE = (
    "/proc/self",
    "/proc/meminfo",
    "/proc/cpuinfo",
    "/proc/stat",
    "/sys/fs/cgroup",
    "/sys/devices/system/cpu",
    "/etc/ssl/openssl.cnf",
    "/etc/locale.alias",
    "/proc/sys/vm/overcommit_memory",
)
"""What language runtimes read about themselves and the machine (node's libuv: memory and CPUs,
its cgroup's limits; Python and glibc: the CPU count; node's OpenSSL: its configuration, not the
keys beside it): nothing of other processes or users."""
CAGE_ENV = {"GIT_CONFIG_NOSYSTEM": "1"}
"""Set for a caged server unless its `env` says otherwise: git refuses to run when it may not read
/etc/gitconfig, and that file is left unreadable because it may hold credentials (a credential
helper's settings, an `http.extraHeader` token). Git's user configuration is the private HOME's."""
SHEBANG_DEPTH = 4
"""Interpreters followed from a script to its interpreter (a venv's console script, a node
script behind `/usr/bin/env node`)."""


def kernel_problem() -> str | None:
    """What this machine lacks for the cage, in words; None when it has everything."""
    if landlock.abi_version() < 1:
        return "the kernel has no Landlock (Linux 5.13+ with landlock among its security modules)"
    machine = os.uname().machine
    try:
        seccomp.build(machine, os.getpid(), processes=True)
    except OSError:
        return f"the cage's seccomp filter has no system-call table for {machine!r}"
    if not Path("/proc/self/status").read_text().count("Seccomp:"):
        return "the kernel has no seccomp"
    return None


def _prefix_of_bin(path: str) -> str | None:
    """`/x/bin/tool` -> `/x`: where an interpreter keeps its libraries."""
    parent = os.path.dirname(path)
    return os.path.dirname(parent) if os.path.basename(parent) == "bin" else None


def _venv(path: str) -> list[str]:
    """A venv's root and its base Python's prefix (pyvenv.cfg `home`), where `path` is in its bin/."""
    parent = os.path.dirname(path)
    config = os.path.join(os.path.dirname(parent), "pyvenv.cfg")
    if os.path.basename(parent) != "bin" or not os.path.isfile(config):
        return []
    found = [os.path.dirname(parent)]
    with open(config, encoding="utf-8", errors="replace") as f:
        for line in f:
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip():
                home = value.strip()
                found.append(_prefix_of_bin(os.path.join(home, "python")) or home)
    return found


def _node_package(path: str) -> list[str]:
    """The directory holding `node_modules` where `path` lies in one (a `node_modules/.bin` link)."""
    parts = Path(path).parts
    if "node_modules" not in parts:
        return []
    return [str(Path(*parts[: parts.index("node_modules")]))]


def _shebang(path: str, search_path: str | None) -> str | None:
    """The interpreter named by a script's `#!` line (through `/usr/bin/env NAME`), or None."""
    try:
        with open(path, "rb") as f:
            line = f.readline(512)
    except OSError:
        return None
    if not line.startswith(b"#!"):
        return None
    words = line[2:].decode("utf-8", "replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env":
        names = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        return shutil.which(names[0], path=search_path) if names else None
    return words[0]


def installation(executable: str, search_path: str | None = None) -> list[str]:
    """What running `executable` reads besides system directories: itself and its link target;
    a venv's root and base prefix; the directory holding a `node_modules` it lies in; and, for
    the interpreters its `#!` line names (followed SHEBANG_DEPTH deep), their prefixes too."""
    found: list[str] = []
    program: str | None = executable
    for depth in range(SHEBANG_DEPTH):
        if program is None or not os.path.exists(program):
            break
        real = os.path.realpath(program)
        for path in dict.fromkeys((program, real)):
            found += [path, *_venv(path), *_node_package(path)]
            if depth:  # an interpreter: its libraries are beside its bin/
                found += filter(None, [_prefix_of_bin(path)])
        program = _shebang(real, search_path)
    return list(dict.fromkeys(found))


def our_python() -> list[str]:
    """What `python` (the interpreter running mcp-grpo) reads: its prefixes, the project, and
    the project's editable source (PEP 610 direct_url.json) where that is another checkout."""
    found = [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix, PROJECT_ROOT]
    try:
        origin = json.loads(metadata.distribution("mcp-grpo").read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        origin = {}
    url = origin.get("url", "")
    if origin.get("dir_info", {}).get("editable") and url.startswith("file://"):
        found.append(url[len("file://"):])
    return list(dict.fromkeys(found))


def paths_in(args: list[str], search_path: str | None = None) -> list[str]:
    """Existing absolute paths among `args`, whole or after `=` (`--db=/data/x.db`), each with
    its installation when it is a program (`node /x/node_modules/pkg/index.js`: /x)."""
    found = []
    for arg in args:
        for candidate in (arg, arg.partition("=")[2]):
            if candidate.startswith("/") and os.path.exists(candidate):
                found += installation(candidate, search_path)
    return found


@dataclass(frozen=True)
class Cage:
    """The confinement of one server instance."""

    writable: tuple[str, ...]
    """Directories where it may change files: its copy of the state, its private HOME and TMP."""
    readable: tuple[str, ...] = ()
    """Extra read-only paths (the server's `state.readable`)."""

    def readable_paths(self, executable: str, args: list[str], search_path: str | None,
                       uses_our_python: bool) -> list[str]:
        """Every path the cage lets the server read, besides `writable`."""
        paths = [*landlock.SYSTEM_READABLE, *RUNTIME_READABLE, *installation(executable, search_path),
                 *(our_python() if uses_our_python else ()), *paths_in(args, search_path), *self.readable]
        return [path for path in dict.fromkeys(paths) if path not in ("", "/")]

    def launch(self, executable: str, args: list[str], env: dict[str, str],
               uses_our_python: bool) -> tuple[list[str], dict[str, str]]:
        """The launcher's command line that runs `executable args` with `env` in this cage, and
        the launcher's own environment: `env` with CAGE_ENV's defaults and without LD_PRELOAD,
        which the launcher hands to the server alone. `executable` without a `/` is looked up on the server's PATH here, so that
        its installation is known."""
        search_path = env.get("PATH")
        if os.sep not in executable:
            executable = shutil.which(executable, path=search_path) or executable
        writes = [part for directory in self.writable for part in ("--write", directory)]
        reads = [part for path in self.readable_paths(executable, args, search_path, uses_our_python)
                 for part in ("--read", path)]
        own_env = {**CAGE_ENV, **env}
        preload = own_env.pop("LD_PRELOAD", "")
        preloads = ["--preload", preload] if preload else []
        argv = [sys.executable, "-I", "-S", LAUNCHER, *writes, *reads, *preloads, "--", executable, *args]
        return argv, own_env
