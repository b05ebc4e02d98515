"""Task datasets: loading files, running generators, and the train/validation split.

- `load_tasks(source)`: a `DatasetSource` (a .json list, .jsonl or .parquet file, or a generator)
  → validated `Task`s. Nothing is skipped: one error lists every bad record of a file (the first
  `MAX_REPORTED` and a count), each with the file, the line (jsonl, 1-based; a line that is not
  JSON or not UTF-8 is a bad record too), item (json, 0-based) or row (parquet, 0-based), and the
  field. A task's `env_class` must be registered (environments/base.py) unless the caller passes
  the config's `environment.env_class`, which overrides every task's.
  Records in the short tool-sequence form (`question` + `tool_sequence`, no `reward_spec`) are
  converted to full tasks (`Task.from_record`). A path with a registered prefix goes to that
  source's loader (`register_path_source`; `bfcl:<categories|all>:<train|eval|all>` loads BFCL
  multi-turn tasks through environments/bfcl/data.py).
- Generators are functions `fn(rng: random.Random, **options) -> Iterable[Task | dict]`,
  registered by name (`calculator`, `multistep`) or given as `module:function`. The seed and
  the split name together seed `rng`, so validation tasks come from a stream disjoint from
  training. Task ids are assigned here (`<name>-<split>-s<seed>-<index>`).
- `train_validation_split(data_cfg, env_class)`: (train, validation) that never share a question
  (compared with `normalize_question`).
- `evaluation_sets(data_cfg, train, env_class)`: the further sets of `data.evaluation_sets` by
  name, each whole; one that shares a question with the training tasks is an error.
"""

from __future__ import annotations

import codecs
import json
import logging
import random
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from environments.base import PATH_SOURCES, load_callable, registered_ids
from environments.config import DataConfig, DatasetSource
from environments.rewards import resolve_custom_reward
from environments.tasks import generators
from environments.tasks.schema import COMPONENTS, Task, TaskDataError, normalize_question

log = logging.getLogger(__name__)

Generator = Callable[..., Iterable[Any]]
GENERATORS: dict[str, Generator] = {
    "calculator": generators.calculator_tasks,
    "multistep": generators.multistep_tasks,
}
"""Generators by name (`generator: <name>` in a dataset source)."""



def register_generator(name: str, fn: Generator) -> None:
    """Make `fn(rng, **options)` available as `generator: <name>`."""
    GENERATORS[name] = fn


def resolve_generator(name: str) -> Generator:
    """A registered generator, or `module:function`; unknown names list the registered ones."""
    if name in GENERATORS:
        return GENERATORS[name]
    if ":" in name:
        return load_callable(name, "generator", TaskDataError)
    raise TaskDataError(f"unknown generator {name!r}; registered: {', '.join(sorted(GENERATORS))}, "
                        "or give module:function")


# -- records -----------------------------------------------------------------------------------

def _decode_json_columns(row: dict) -> dict:
    """Parquet rows may hold nested fields as JSON strings (what `save_tasks` writes)."""
    out = dict(row)
    for key in ("prompt", "reward_spec", "extra_info", "tool_sequence"):
        if isinstance(out.get(key), str):
            out[key] = json.loads(out[key])
    # Struct columns give every row every key of the union; absent ones come back as null.
    for key in ("reward_spec", "extra_info"):
        if isinstance(out.get(key), dict):
            out[key] = _drop_nulls(out[key])
    return out


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


# -- files -------------------------------------------------------------------------------------

MAX_REPORTED = 20
"""Bad records listed in one error; the rest are counted."""


class BadRecords:
    """The problems of one file (or one check), each `<file> line N: field: what is wrong`,
    raised together."""

    def __init__(self, name: str):
        self.name = name
        self.shown: list[str] = []
        self.count = 0

    def add(self, problem: str) -> None:
        self.count += 1
        if len(self.shown) < MAX_REPORTED:
            self.shown.append(problem)

    def raise_if_any(self) -> None:
        if self.count == 1:
            raise TaskDataError(self.shown[0])
        if self.count:
            more = f" (the first {MAX_REPORTED} below)" if self.count > MAX_REPORTED else ""
            lines = [f"{self.name}: {self.count} bad records{more}"]
            lines += ["  " + problem.replace("\n", "\n  ") for problem in self.shown]
            if self.count > MAX_REPORTED:
                lines.append(f"  ... and {self.count - MAX_REPORTED} more")
            raise TaskDataError("\n".join(lines))


def _not_utf8(where: str, raw: bytes, exc: UnicodeDecodeError, line_start: int = 0) -> str:
    column = exc.start - line_start + 1
    return f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {column}); save the file as UTF-8"


def _read_records(path: Path) -> Iterable[tuple[Any, str, str | None]]:
    """(record, where, problem) per record; `problem` (then `record` is None) for a line that
    cannot be read. Problems of the whole file raise TaskDataError. A byte-order mark (which some
    editors write) may open a JSON file."""
    name = str(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        with path.open("rb") as f:
            for number, raw in enumerate(f, start=1):
                where = f"{name} line {number}"
                if number == 1:
                    raw = raw.removeprefix(codecs.BOM_UTF8)
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    yield None, where, _not_utf8(where, raw, exc)
                    continue
                if not line.strip():
                    continue  # blank lines separate nothing; they are not records
                try:
                    yield json.loads(line), where, None
                except json.JSONDecodeError as exc:
                    yield None, where, f"{where}: invalid JSON: {exc}"
    elif suffix == ".json":
        raw = path.read_bytes().removeprefix(codecs.BOM_UTF8)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = raw.count(b"\n", 0, exc.start) + 1
            line_start = raw.rfind(b"\n", 0, exc.start) + 1
            raise TaskDataError(_not_utf8(f"{name} line {line}", raw, exc, line_start)) from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskDataError(f"{name}: invalid JSON: {exc}") from None
        if not isinstance(data, list):
            raise TaskDataError(f"{name}: expected a JSON list of task records, got {type(data).__name__}")
        for index, item in enumerate(data):
            yield item, f"{name} item {index}", None
    elif suffix == ".parquet":
        try:
            rows = pq.read_table(path).to_pylist()
        except (pa.ArrowException, OSError) as exc:
            raise TaskDataError(f"{name}: cannot read it as parquet: {exc}") from None
        for index, row in enumerate(rows):
            where = f"{name} row {index}"
            try:
                yield _decode_json_columns(row), where, None
            except json.JSONDecodeError as exc:
                yield None, where, f"{where}: a JSON column is not valid JSON: {exc}"
    else:
        raise TaskDataError(f"{name}: unknown task file type {suffix!r}; use .json, .jsonl or .parquet")


def env_class_problem(env_class: Any) -> str | None:
    """What is wrong with a task's `env_class` (not a registered environment), or None."""
    registered = registered_ids()
    if env_class in registered:
        return None
    return (f"env_class: got {env_class!r}; registered: {', '.join(registered) or 'none'} "
            "(or set environment.env_class for every task)")


def _declared_task_id(record: Any) -> str | None:
    """The task id a record declares, read without validating it (None where it declares none):
    a duplicate id is named even in a record that has other errors."""
    if not isinstance(record, dict):
        return None
    if "reward_spec" not in record:
        return str(record["task_id"]) if record.get("task_id") else None
    spec = record["reward_spec"]
    truth = spec.get("ground_truth") if isinstance(spec, dict) else None
    task_id = truth.get("task_id") if isinstance(truth, dict) else None
    return task_id if isinstance(task_id, str) and task_id else None


def _record_problems(record: Any, where: str, env_class: str | None,
                     seen: dict[str, str]) -> tuple[Task | None, list[str]]:
    """A record's task and all of its problems at once: its fields, its `env_class` (unless the
    config's `env_class` overrides it) and an id used before (`seen`: id -> where, updated)."""
    task, problems = Task.check_record(record)
    if env_class is None:
        declared = task.env_class if task is not None else (
            record.get("env_class", "mcp_tool") if isinstance(record, dict) else None)
        wrong_env = None if declared is None else env_class_problem(declared)
        if wrong_env is not None:
            problems.append(wrong_env)
    task_id = task.task_id if task is not None else _declared_task_id(record)
    if task_id is not None and task_id in seen:
        problems.append(f"reward_spec.ground_truth.task_id: {task_id!r} is already used at {seen[task_id]}")
    elif task_id is not None:
        seen[task_id] = where
    return (None, problems) if problems else (task.with_origin(where), [])


def load_file(path: str | Path, env_class: str | None = None) -> list[Task]:
    """The tasks of a .jsonl, .json or .parquet file; every bad record in one TaskDataError, each
    with all of its problems. `env_class`: the config's `environment.env_class` (null: each task's
    own must be registered)."""
    path = Path(path)
    if path.is_dir():
        raise TaskDataError(f"task file {str(path)!r} is a directory; give a .jsonl, .json or .parquet file of "
                            "task records")
    if not path.is_file():
        raise TaskDataError(f"task file {str(path)!r} does not exist")
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    bad = BadRecords(str(path))
    try:
        for record, where, problem in _read_records(path):
            if problem is not None:
                bad.add(problem)
                continue
            task, problems = _record_problems(record, where, env_class, seen)
            if problems:
                bad.add(f"{where}: " + "\n  ".join(problems))
            else:
                tasks.append(task)
    except OSError as exc:  # unreadable (permissions, a device error): name the file, not a traceback
        raise TaskDataError(f"{path}: cannot read it: {exc.strerror or exc}") from None
    bad.raise_if_any()
    if not tasks:
        raise TaskDataError(f"{path}: no task records")
    return tasks


def save_tasks(tasks: Iterable[Task], path: str | Path) -> None:
    """Write tasks as .jsonl, .json or .parquet (nested fields as JSON strings in parquet)."""
    path = Path(path)
    records = [t.model_dump(mode="json", exclude_defaults=False) for t in tasks]
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif suffix == ".json":
        path.write_text(json.dumps(records, indent=1), encoding="utf-8")
    elif suffix == ".parquet":
        rows = [{**r, "reward_spec": json.dumps(r["reward_spec"]), "extra_info": json.dumps(r["extra_info"])}
                for r in records]
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        raise TaskDataError(f"{path}: unknown task file type {suffix!r}; use .json, .jsonl or .parquet")


# -- generators --------------------------------------------------------------------------------

def _generator_label(name: str) -> str:
    return name.rsplit(":", 1)[-1].replace("_", "-")


def generate_tasks(
    name: str,
    num_tasks: int,
    seed: int = 0,
    options: dict | None = None,
    split: str = "train",
    exclude_questions: set[str] | frozenset[str] = frozenset(),
) -> list[Task]:
    """`num_tasks` tasks with distinct questions, none in `exclude_questions`.

    The stream is seeded by (generator, split, seed): the same arguments give the same tasks,
    and another split gives another stream.
    """
    fn = resolve_generator(name)
    rng = random.Random(f"mcp-grpo|{name}|{split}|{seed}")
    label = _generator_label(name)
    try:
        produced = iter(fn(rng, **(options or {})))
    except TypeError as exc:
        raise TaskDataError(f"generator {name!r}: bad options {options}: {exc}") from exc
    tasks: list[Task] = []
    questions = set(exclude_questions)
    attempts, max_attempts = 0, 50 * num_tasks + 1000
    while len(tasks) < num_tasks:
        attempts += 1
        try:
            item = next(produced, None)
        except ValueError as exc:  # a generator checks its option values as it starts
            raise TaskDataError(f"generator {name!r}: bad options {options}: {exc}") from exc
        if item is None or attempts > max_attempts:
            raise TaskDataError(
                f"generator {name!r} (options {options or {}}) gave only {len(tasks)} distinct questions for "
                f"the {split} split after {attempts - 1} tries; {num_tasks} were asked for"
            )
        task = item if isinstance(item, Task) else Task.from_record(item, f"generator {name!r} item {attempts - 1}")
        key = normalize_question(task)
        if key in questions:
            continue  # the same question twice (or one of the training questions)
        questions.add(key)
        task_id = f"{label}-{split}-s{seed}-{len(tasks):05d}"
        gt = task.reward_spec.ground_truth.model_copy(update={"task_id": task_id})
        task = task.model_copy(update={"reward_spec": task.reward_spec.model_copy(update={"ground_truth": gt})})
        tasks.append(task.with_origin(f"generator {name!r} task {task_id!r}"))
    return tasks


def load_tasks(source: DatasetSource, split: str = "train", exclude_questions: Iterable[str] = (),
               env_class: str | None = None) -> list[Task]:
    """The tasks of one source: a file's records, or `num_tasks` generated tasks. Custom reward
    functions (`module:function` methods) are imported here, so a bad path fails before training.
    `env_class`: the config's `environment.env_class`; null: every task's own must be registered."""
    prefix = next((p for p in PATH_SOURCES if source.path is not None and source.path.startswith(p)), None)
    if prefix is not None:
        loader = load_callable(PATH_SOURCES[prefix], f"dataset source {prefix!r}", TaskDataError)
        try:
            tasks = loader(source.path)
        except (ValueError, ImportError) as exc:  # a bad spec, or a missing package (named by the loader)
            raise TaskDataError(f"dataset {source.path!r}: {exc}") from exc
    elif source.path is not None:
        tasks = load_file(source.path, env_class)  # checks env_class per record, with its line
    else:
        tasks = generate_tasks(source.generator, source.num_tasks, source.seed, source.options, split,
                               frozenset(exclude_questions))
    where = source.path or f"generator {source.generator!r}"
    if env_class is None and (prefix is not None or source.path is None):
        bad = BadRecords(where)
        for task in tasks:
            problem = env_class_problem(task.env_class)
            if problem is not None:
                bad.add(f"{where}: task {task.task_id!r}: {problem}")
        bad.raise_if_any()
    _check_custom_rewards(tasks, where)
    return tasks


def _check_custom_rewards(tasks: list[Task], where: str) -> None:
    checked: set[str] = set()
    for task in tasks:
        for method in task.reward_spec.method:
            if method in COMPONENTS or method in checked:
                continue
            checked.add(method)
            try:
                resolve_custom_reward(method)
            except ValueError as exc:
                raise TaskDataError(f"{where}: task {task.task_id!r}: reward_spec.method: {exc}") from None


def train_validation_split(data_cfg: DataConfig, env_class: str | None = None) -> tuple[list[Task], list[Task]]:
    """Training and held-out tasks that never share a question.

    - `validation` given: its tasks, minus any whose question is also a training question
      (dropped with a warning; an empty result is an error).
    - No `validation`, generator training source: `validation_size` tasks from the same
      generator's validation stream, excluding every training question.
    - No `validation`, file training source: `validation_size` distinct questions held out of the
      file (seeded by `train.seed`), with every task that asks them.

    `env_class`: the config's `environment.env_class`, which overrides every task's own (null:
    each task's must be registered).
    """
    if data_cfg.validation is None and data_cfg.train.path is not None:
        return _split_file(load_tasks(data_cfg.train, env_class=env_class), data_cfg.validation_size,
                           data_cfg.train.seed, data_cfg.train.path)
    train = load_tasks(data_cfg.train, "train", env_class=env_class)
    train_questions = {normalize_question(t) for t in train}
    if data_cfg.validation is None:
        source = data_cfg.train.model_copy(update={"num_tasks": data_cfg.validation_size})
        return train, load_tasks(source, "validation", train_questions, env_class)
    validation = load_tasks(data_cfg.validation, "validation", train_questions, env_class)
    kept = [t for t in validation if normalize_question(t) not in train_questions]
    if len(kept) < len(validation):
        log.warning("data: dropped %d validation tasks whose question is also a training question",
                    len(validation) - len(kept))
    if not kept:
        raise TaskDataError("every validation task asks a training question: nothing is held out")
    return train, kept


def evaluation_sets(data_cfg: DataConfig, train: Sequence[Task],
                    env_class: str | None = None) -> dict[str, list[Task]]:
    """The tasks of each of `data.evaluation_sets`, by name. Unlike the held-out split, a set is
    never trimmed: a task that asks a training question is an error naming it."""
    train_questions = {normalize_question(t) for t in train}
    sets = {}
    for name, source in data_cfg.evaluation_sets.items():
        tasks = load_tasks(source, f"evaluation-{name}", train_questions, env_class)
        shared = [t for t in tasks if normalize_question(t) in train_questions]
        if shared:
            raise TaskDataError(f"data.evaluation_sets.{name}: {len(shared)} of its {len(tasks)} tasks ask a training "
                                f"question (task {shared[0].task_id!r}: {shared[0].question!r}); an evaluation set "
                                "must stay out of training")
        if not tasks:
            raise TaskDataError(f"data.evaluation_sets.{name}: it has no tasks")
        sets[name] = tasks
    return sets


def _split_file(tasks: list[Task], size: int, seed: int, path: str) -> tuple[list[Task], list[Task]]:
    by_question: dict[str, list[Task]] = {}
    for task in tasks:
        by_question.setdefault(normalize_question(task), []).append(task)
    questions = list(by_question)
    if size >= len(questions):
        raise TaskDataError(
            f"{path}: {len(questions)} distinct questions cannot give {size} held-out ones and leave any for "
            "training; lower data.validation_size or give data.validation"
        )
    random.Random(f"mcp-grpo|split|{seed}").shuffle(questions)
    held_out = set(questions[:size])
    train = [t for t in tasks if normalize_question(t) not in held_out]
    validation = [t for t in tasks if normalize_question(t) in held_out]
    return train, validation
