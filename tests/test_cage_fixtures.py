"""Fixtures copied without following links out of them (tools/cage/fixture.py), and path arguments
checked against an episode's copy (tools/cage/path_arguments.py): links inside a fixture land
inside the copy (absolute, relative, to a directory), so an episode's writes through them never
reach the original and the next episode's copy is fresh; a link out of the fixture stops start-up
naming it; path arguments are found by their schema alone and resolved through links."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from conftest import REPO
from servers.leaks import no_leftover_server_processes  # noqa: F401 - session-level leak check

from tools.cage.command import kernel_problem
from tools.cage.fixture import FixtureLinkError, outside_links, restore
from tools.cage.path_arguments import declares_path, outside
from tools.config import ToolsConfig
from tools.manager import SharedToolManager, ToolServerStartError

HOSTILE = str(REPO / "tests" / "servers" / "hostile.py")
NO_CAGE = kernel_problem()


@pytest.fixture
def linked_fixture(tmp_path) -> Path:
    """data.txt, sub/inner.txt, and links to them: absolute, relative, to a directory, and up."""
    root = tmp_path / "fixture"
    (root / "sub").mkdir(parents=True)
    (root / "data.txt").write_text("original")
    (root / "sub" / "inner.txt").write_text("inner")
    (root / "absolute").symlink_to(root / "data.txt")
    (root / "relative").symlink_to("data.txt")
    (root / "folder").symlink_to(root / "sub", target_is_directory=True)
    (root / "sub" / "up").symlink_to("../data.txt")
    return root


def run(coro):
    return asyncio.run(coro)


def snapshot(root: Path) -> dict[str, str]:
    """Regular files only: links are looked at apart."""
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def test_links_inside_the_fixture_point_inside_the_copy(tmp_path, linked_fixture):
    copy = tmp_path / "copy"
    restore(copy, linked_fixture)
    assert {name: os.readlink(copy / name) for name in ("absolute", "relative", "folder", "sub/up")} == {
        "absolute": "data.txt", "relative": "data.txt", "folder": "sub", "sub/up": "../data.txt"}
    assert (copy / "folder").resolve() == (copy / "sub").resolve()
    assert snapshot(copy) == {"data.txt": "original", "sub/inner.txt": "inner"}


def test_a_link_out_of_the_fixture_is_found_and_never_copied(tmp_path, linked_fixture):
    (tmp_path / "private.txt").write_text("private")
    (linked_fixture / "escape").symlink_to(tmp_path / "private.txt")
    (linked_fixture / "sub" / "climb").symlink_to("../../private.txt")
    assert outside_links(linked_fixture) == [("escape", str(tmp_path / "private.txt")),
                                             ("sub/climb", "../../private.txt")]
    with pytest.raises(FixtureLinkError, match=f"the fixture's link 'escape' points out of it, to "
                                               f"'{tmp_path / 'private.txt'}'"):
        restore(tmp_path / "copy", linked_fixture)


def test_a_file_fixture_given_as_a_link_is_copied_as_its_content(tmp_path):
    (tmp_path / "real.db").write_text("rows")
    (tmp_path / "shop.db").symlink_to(tmp_path / "real.db")
    restore(tmp_path / "copy", tmp_path / "shop.db")
    copied = tmp_path / "copy" / "shop.db"
    assert not copied.is_symlink() and copied.read_text() == "rows"


@pytest.mark.parametrize("isolation", ["paths", pytest.param("landlock", marks=pytest.mark.skipif(
    NO_CAGE is not None, reason=f"no cage on this machine: {NO_CAGE}"))])
def test_writes_through_fixture_links_stay_in_the_episodes_copy(linked_fixture, isolation):
    config = ToolsConfig(servers={"hostile": {"command": "python", "args": [HOSTILE], "startup_timeout": 60,
                                              "state": {"fixture": str(linked_fixture), "pool_size": 1,
                                                        "reset": "copy", "isolation": isolation}}})

    async def scenario():
        async with SharedToolManager(config) as manager:
            for label in ("absolute", "relative", "folder/inner.txt", "sub/up", "folder/new.txt"):
                saved = await manager.call_tool("save_note", {"note": f"via {label}", "label": label},
                                                episode_id="one")
                assert not saved.is_error, saved.text
            seen = (await manager.call_tool("read_note", {"label": "data.txt"}, episode_id="one")).text
            await manager.end_episode("one")
            fresh = [(await manager.call_tool("read_note", {"label": name}, episode_id="two")).text
                     for name in ("data.txt", "sub/inner.txt")]
            return seen, fresh

    seen, fresh = run(scenario())
    assert seen == "via sub/up"  # the last of the writes through links to data.txt
    assert fresh == ["original", "inner"]
    assert snapshot(linked_fixture) == {"data.txt": "original", "sub/inner.txt": "inner"}


def test_a_fixture_linking_out_stops_start_up_naming_the_link(tmp_path, linked_fixture):
    (linked_fixture / "escape").symlink_to(tmp_path)
    config = ToolsConfig(servers={"hostile": {"command": "python", "args": [HOSTILE],
                                              "state": {"fixture": str(linked_fixture), "isolation": "paths"}}})

    async def scenario():
        async with SharedToolManager(config):
            pass

    with pytest.raises(ToolServerStartError) as caught:
        run(scenario())
    assert caught.value.cause == (f"state.fixture {str(linked_fixture)!r} holds links that point out of it "
                                  f"('escape' -> {str(tmp_path)!r}): an episode would reach their targets; "
                                  "copy what they point to into the fixture")


# -- path arguments --------------------------------------------------------------------------------

def test_path_arguments_are_known_by_name_description_or_format():
    by_name = ["repo_path", "filePath", "files", "directory", "folder", "dir", "repository", "paths", "dirname"]
    plain = ["content", "query", "label", "source", "excludePatterns", "branch_name", "profile"]
    assert [declares_path(name, {}) for name in by_name] == [True] * len(by_name)
    assert [declares_path(name, {}) for name in plain] == [False] * len(plain)
    described = {"The path to the Git repository.": True, "The file to read": True,
                 "Content to write to the file": False, "SELECT SQL query to execute": False,
                 "Where the backups go (a directory)": True}
    assert {text: declares_path("x", {"description": text}) for text in described} == described
    assert [declares_path("x", {"format": form}) for form in ("path", "file-path", "uri", "date")] == [
        True, True, False, False]


def test_path_arguments_must_resolve_inside_the_copy(tmp_path):
    copy = tmp_path / "copy"
    (copy / "docs").mkdir(parents=True)
    (copy / "door").symlink_to("/etc")
    schema = {"type": "object", "$defs": {"Where": {"type": "object", "properties": {"folder": {"type": "string"}}}},
              "properties": {"path": {"type": "string"}, "paths": {"type": "array", "items": {"type": "string"}},
                             "query": {"type": "string"},
                             "options": {"anyOf": [{"$ref": "#/$defs/Where"}, {"type": "null"}]},
                             "edits": {"type": "array", "items": {"type": "object", "properties": {
                                 "file": {"type": "string"}, "text": {"type": "string"}}}}}}
    inside = [{"path": "."}, {"path": ""}, {"path": "docs/../docs/a.txt"}, {"path": str(copy / "docs")},
              {"paths": ["a", "docs/b"]}, {"query": "VACUUM INTO '/tmp/x.db'"}, {"options": None},
              {"options": {"folder": "docs"}}, {"edits": [{"file": "a", "text": "/etc/passwd"}]}]
    assert [outside(schema, args, str(copy)) for args in inside] == [None] * len(inside)
    refused = {"path": ("..", {"path": ".."}), "paths[1]": ("/etc", {"paths": ["a", "/etc"]}),
               "options.folder": ("../x", {"options": {"folder": "../x"}}),
               "edits[0].file": ("/x", {"edits": [{"file": "/x"}]}),
               "path ": ("door/passwd", {"path": "door/passwd"}), "path  ": ("~/x", {"path": "~/x"}),
               "path   ": ("file:///etc", {"path": "file:///etc"})}
    for where, (value, args) in refused.items():
        assert outside(schema, args, str(copy)) == (
            f"argument {where.strip()!r}: the path {value!r} is outside this episode's state; paths are "
            "relative to its directory ('.' is the directory itself)")
