"""Turn chat logs with tool calls into verified task records:
`python -m launch.import_conversations --config configs/mcp_servers.yaml --chats logs.jsonl
--out outputs/data/imported.jsonl`

CHATS: one conversation per line (`{"messages": [...]}` or a bare list of messages), or a JSON
list of them, in the OpenAI chat format (assistant `tool_calls`, `tool` messages with the
results). Each log's calls are re-executed on the config's servers (only calls the generation's
safety policy allows; `--allow-tool server.tool` opts a tool in) and must give the results the log
recorded; the first user message becomes the prompt, the calls the `tool_sequence`, and the last
result the answer where the final message states it. Logs that do not verify, or cannot be read
(a line that is not JSON, a message that is not an object, ...), are kept out and named with
their index (printed, and in OUT with `.report.json`); the others go on. CHATS must be a regular
file of at most 256 MiB. Keys and tokens in the logs are masked (`***`)
and never written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import stat
import sys
from pathlib import Path

from environments.taskgen.conversations import UnreadableLog, import_conversations
from environments.taskgen.run import later_tools
from grpo.config import ConfigError, load_config
from launch.interrupt import stops_cleanly_on_interrupt
from tools.manager import SharedToolManager, ToolServerStartError
from tools.secrets import mask_text, mask_value

MAX_CHATS_BYTES = 256 * 2**20
"""The largest chat-log file read (split a larger one): the logs are held in memory at once."""


def read_chats(path: Path, max_bytes: int = MAX_CHATS_BYTES) -> list:
    """The logs in `path`, one per line (`.jsonl`) or a JSON list (`.json`). A line that is not
    JSON becomes an UnreadableLog naming it (kept out; the other lines go on); ValueError for a
    path that is not a regular file (a device such as /dev/zero would be read forever), a file
    over `max_bytes`, text that is not UTF-8, or a `.json` file that is not a list."""
    if not path.exists():
        raise ValueError(f"{path} does not exist")
    if not stat.S_ISREG(path.stat().st_mode):
        raise ValueError(f"{path} is not a regular file (chat logs are read from a .jsonl or .json file)")
    with path.open("rb") as source:
        data = source.read(max_bytes + 1)  # one byte more tells a file over the limit
    if len(data) > max_bytes:
        limit = f"{max_bytes // 2**20} MiB" if max_bytes >= 2**20 else f"{max_bytes} bytes"
        raise ValueError(f"{path} is larger than {limit}, the most read at once; split it into several files")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text ({exc})") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise ValueError(f"{path} is not JSON: {exc}") from None
        if not isinstance(data, list):
            raise ValueError(f"{path}: expected a JSON list of conversations")
        # A list of messages is one conversation; a list of conversations is many.
        return [data] if data and isinstance(data[0], dict) and "role" in data[0] else data
    items: list = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                items.append(json.loads(line))
            except (ValueError, RecursionError) as exc:
                items.append(UnreadableLog(f"line {number} is not JSON: {exc}"))
    return items


async def _run(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    items = read_chats(Path(args.chats))
    later_config = later_tools(config.tools)
    async with SharedToolManager(config.tools) as tools, \
            (SharedToolManager(later_config) if later_config else contextlib.nullcontext()) as later:
        kept, rejected = await import_conversations(tools, items, allow=args.allow_tool, later=later)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Everything written or printed passes the one secrets rule again (tools/secrets.py): what
    # import masked already stays as it is, and nothing it missed reaches a file.
    kept, rejected = mask_value(kept)[0], mask_value(rejected)[0]
    out.write_text("".join(json.dumps(r) + "\n" for r in kept), encoding="utf-8")
    report = out.with_name(out.name.removesuffix(".jsonl") + ".report.json")
    report.write_text(json.dumps({"kept": len(kept), "kept_out": rejected}, indent=1) + "\n", encoding="utf-8")
    for item in rejected:
        print(f"kept out: conversation {item['index']}: {item['reason']}")
    print(f"{len(kept)} of {len(items)} conversations verified; wrote {out} and {report}")
    return 0 if kept else 2


@stops_cleanly_on_interrupt
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML run config whose tools.servers re-execute the calls")
    parser.add_argument("--chats", required=True, help="chat logs (.jsonl, or a .json list)")
    parser.add_argument("--out", required=True, help="task records .jsonl")
    parser.add_argument("--allow-tool", action="append", default=[], metavar="SERVER.TOOL",
                        help="re-execute this tool (glob) though it may write and its server has no per-episode state")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_run(args))
    except (ConfigError, ToolServerStartError, ValueError, OSError) as exc:
        print(f"import_conversations: {mask_text(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
