"""The cage: a stdio MCP server confined by the kernel to its own directories.

`launcher.py` is the program the manager starts in the server's place: it confines itself
(capabilities dropped, Landlock, seccomp; all inherited across exec) and then executes the server.
`landlock.py`, `seccomp.py` and `capabilities.py` are the kernel primitives it uses, shared with
the Python sandbox (tools/servers/sandbox.py); all four use the standard library alone, so the
launcher starts fast and the sandbox can import them before its own lock-down.
"""
