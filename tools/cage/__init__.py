"""Containment of a stateful server's episodes: the cage and what goes with it.

- `launcher.py`: the program the manager starts in a caged server's place; it confines itself
  (capabilities dropped, Landlock, seccomp; all inherited across exec) and executes the server.
- `command.py`: the launcher's command line for one instance, and what the server may read.
- `path_arguments.py`: path arguments checked against the episode's copy (every isolation level).
- `fixture.py`: fixtures copied without following links out of them.
- `containment.py`: `Containment`, what each level contains and leaves open.
- `landlock.py`, `seccomp.py`, `capabilities.py`: the kernel primitives, shared with the Python
  sandbox (tools/servers/sandbox.py). These and the launcher use the standard library alone, so
  the launcher starts fast and the sandbox can import them before its own lock-down.
"""
