"""Task records, loaders (.jsonl/.json/.parquet), generators and the train/validation split."""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from environments.base import registered_ids
from environments.config import DataConfig, DatasetSource
from environments.tasks.loading import (
    GENERATORS,
    generate_tasks,
    load_tasks,
    register_generator,
    save_tasks,
    train_validation_split,
)
from environments.tasks.schema import SHORT_FORM_FIELDS, Task, TaskDataError, normalize_question
from tools.servers.calculator import evaluate

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "configs" / "data" / "calculator_sample.jsonl"


def record(task_id="t1", question="What is 2 * 3?", **ground_truth) -> dict:
    gt = {"task_id": task_id, "complexity": "easy", "success": {"answer": 6}, **ground_truth}
    return {"data_source": "test", "prompt": [{"role": "user", "content": question}],
            "reward_spec": {"method": "final_answer", "ground_truth": gt}}


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


# -- records and files -----------------------------------------------------------------------

def test_sample_files_load():
    tasks = load_tasks(DatasetSource(path=str(SAMPLE)))
    assert len(tasks) == 5 and tasks[0].task_id == "calc-sample-000"
    assert tasks[0].question == "What is 323 * 884?" and tasks[0].ground_truth.success.answer == 323 * 884
    for name in ("multistep_sample.jsonl", "tool_sequence_sample.jsonl"):
        assert load_tasks(DatasetSource(path=str(REPO / "configs" / "data" / name)))


def test_bad_record_names_file_line_and_field(tmp_path):
    records = [record(f"t{i}", f"What is {i} * 3?") for i in range(1, 7)]
    bad = record("t7", "What is 7 * 3?", complexity="extreme")
    path = write_jsonl(tmp_path / "tasks.jsonl", [*records, bad])
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(path)))
    assert str(info.value) == (f"{path} line 7: reward_spec.ground_truth.complexity: got 'extreme'; "
                               "allowed: easy, medium, hard")


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r["reward_spec"]["ground_truth"].pop("task_id"), "reward_spec.ground_truth.task_id: missing (required)"),
    (lambda r: r["reward_spec"]["ground_truth"].update(sucess={}), "reward_spec.ground_truth.sucess: unknown field"),
    (lambda r: r["reward_spec"].update(method="magic"), "reward_spec.method: got 'magic'; allowed: final_answer"),
    (lambda r: r["reward_spec"].update(method="state"), "method 'state' needs ground_truth.success.state"),
    (lambda r: r.update(prompt=[{"role": "system", "content": "x"}]), "prompt: needs at least one user message"),
    (lambda r: r["prompt"].append({"role": "robot", "content": "x"}), "prompt.1.role: got 'robot'; allowed: system"),
    (lambda r: r["reward_spec"]["ground_truth"]["success"].update(answer={"a": 1}),
     "reward_spec.ground_truth.success.answer: got {'a': 1}; expected a number"),
])
def test_field_errors(mutate, message):
    bad = record()
    mutate(bad)
    with pytest.raises(TaskDataError) as info:
        Task.from_record(bad, "x.jsonl line 3")
    assert str(info.value).startswith("x.jsonl line 3: ")
    assert message in str(info.value)


def test_invalid_json_line_and_duplicate_ids(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [record(), "{not json"])
    with pytest.raises(TaskDataError, match=r"a.jsonl line 2: invalid JSON"):
        load_tasks(DatasetSource(path=str(path)))
    path = write_jsonl(tmp_path / "b.jsonl", [record("same"), "", record("same", "What is 1 * 1?")])
    with pytest.raises(TaskDataError, match=r"b.jsonl line 3: .*'same' is already used at .*b.jsonl line 1"):
        load_tasks(DatasetSource(path=str(path)))


def test_json_list_item_index(tmp_path):
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps([record("a"), record("b", complexity="hardest")]))
    with pytest.raises(TaskDataError, match=re.escape("tasks.json item 1: reward_spec.ground_truth.complexity")):
        load_tasks(DatasetSource(path=str(path)))
    path.write_text(json.dumps({"tasks": []}))
    with pytest.raises(TaskDataError, match="expected a JSON list"):
        load_tasks(DatasetSource(path=str(path)))


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_save_and_load_round_trip(tmp_path, suffix):
    tasks = generate_tasks("multistep", 3, seed=1) + generate_tasks("calculator", 3, seed=1)
    path = tmp_path / f"tasks{suffix}"
    save_tasks(tasks, path)
    assert load_tasks(DatasetSource(path=str(path))) == tasks


def test_parquet_struct_columns_and_row_errors(tmp_path):
    # Written by another tool as nested structs (not JSON strings): absent keys come back null.
    rows = [record("a"), record("b", "What is 9 * 9?", max_turns=3)]
    rows[0]["reward_spec"]["ground_truth"]["tool_sequence"] = [{"tool": "calculate", "params": {"expression": "2*3"}}]
    path = tmp_path / "tasks.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tasks = load_tasks(DatasetSource(path=str(path)))
    assert tasks[0].ground_truth.tool_sequence[0].params == {"expression": "2*3"}
    assert tasks[1].ground_truth.max_turns == 3 and tasks[1].ground_truth.tool_sequence == []
    rows[1]["reward_spec"]["ground_truth"]["complexity"] = "extreme"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(TaskDataError, match=re.escape("tasks.parquet row 1: reward_spec.ground_truth.complexity")):
        load_tasks(DatasetSource(path=str(path)))


def test_custom_reward_paths_are_checked_at_load(tmp_path):
    bad = record()
    bad["reward_spec"]["method"] = ["final_answer", "tests.test_rewards:no_such_function"]
    path = write_jsonl(tmp_path / "tasks.jsonl", [bad])
    with pytest.raises(TaskDataError, match=r"task 't1': reward_spec.method: custom reward .*cannot load"):
        load_tasks(DatasetSource(path=str(path)))


def test_unknown_suffix_and_missing_file(tmp_path):
    (tmp_path / "t.csv").write_text("x")
    with pytest.raises(TaskDataError, match="unknown task file type '.csv'"):
        load_tasks(DatasetSource(path=str(tmp_path / "t.csv")))
    with pytest.raises(TaskDataError, match="does not exist"):
        load_tasks(DatasetSource(path=str(tmp_path / "nope.jsonl")))


def test_tool_sequence_records_are_converted(tmp_path):
    spec = {"question": "Store 7 under lucky.", "tool_sequence": [{"server": "kv", "tool": "put",
                                                                    "params": {"key": "lucky", "value": 7}}],
            "state": {"kv": {"lucky": 7}}}
    task = Task.from_record(spec, "spec")
    assert task.reward_spec.method == ["tool_sequence", "state"]
    assert task.complexity == "easy" and task.ground_truth.tool_sequence[0].step == 1
    assert task.task_id.startswith("seq-") and task.question == "Store 7 under lucky."
    path = write_jsonl(tmp_path / "specs.jsonl", [spec, {"question": "x", "tool_sequence": []}])
    with pytest.raises(TaskDataError, match="specs.jsonl line 2: tool_sequence: needs a non-empty list"):
        load_tasks(DatasetSource(path=str(path)))
    with pytest.raises(TaskDataError, match=r"spec: unknown field\(s\) \['anwser'\] in a tool-sequence record"):
        Task.from_record({**spec, "anwser": 1}, "spec")


# -- generators ------------------------------------------------------------------------------

def test_calculator_generator_default_task():
    tasks = generate_tasks("calculator", 50, seed=3)
    assert tasks == generate_tasks("calculator", 50, seed=3)  # deterministic
    assert tasks != generate_tasks("calculator", 50, seed=4)
    for task in tasks:
        a, b = map(int, re.fullmatch(r"What is (\d{3}) \* (\d{3})\?", task.question).groups())
        gt = task.ground_truth
        assert gt.success.answer == a * b and gt.complexity == "easy"
        assert [(s.server, s.tool, s.params) for s in gt.tool_sequence] == [
            ("calculator", "calculate", {"expression": f"{a} * {b}"})]
    assert len({t.task_id for t in tasks}) == 50 and tasks[0].task_id == "calculator-train-s3-00000"


def test_calculator_multi_step_expressions_match_the_real_calculator():
    tasks = generate_tasks("calculator", 30, seed=0, options={"digits": [1, 3], "terms": 4, "ops": ["+", "-", "*"],
                                                              "instruction": "Answer with the number only."})
    for task in tasks:
        expression = task.extra_info["expression"]
        assert evaluate(expression) == task.ground_truth.success.answer
        assert task.question.endswith("? Answer with the number only.")
        assert task.complexity == "medium"


def test_calculator_kinds_come_in_turn_and_their_answers_are_the_real_calculators():
    kinds = ["sum", "difference", "product", "quotient", "word", "two_step"]
    tasks = generate_tasks("calculator", 120, seed=0, options={"kinds": kinds})
    assert [t.extra_info["kind"] for t in tasks[:12]] == kinds * 2
    operators = {"sum": " + ", "difference": " - ", "product": " * ", "quotient": " // "}
    for task in tasks:
        kind, expression = task.extra_info["kind"], task.extra_info["expression"]
        answer = task.ground_truth.success.answer
        assert evaluate(expression) == answer and isinstance(answer, int) and answer >= 0
        assert [s.params for s in task.ground_truth.tool_sequence] == [{"expression": expression}]
        assert task.complexity == ("medium" if kind == "two_step" else "easy")
        if kind in operators:  # one operation, its operands written as in the expression
            a, b = expression.split(operators[kind])
            assert a in task.question.replace(",", "") and b in task.question.replace(",", "")
        if kind == "two_step":
            assert len(re.findall(r" [-+*] ", expression)) == 2
    word = [t.question for t in tasks if t.extra_info["kind"] == "word"]
    assert all(not re.search(r"\d \S{1,2} \d", q) for q in word)  # stories, not symbols


def test_calculator_request_spells_what_a_user_writes():
    from environments.tasks.generators import calculator_request

    rng = random.Random(5)
    question, expression, value = calculator_request(rng, "quotient")
    assert (question, expression, value) == (
        "How many whole times does 97 go into 36657?", "36657 // 97", 377)
    with pytest.raises(ValueError, match="unknown calculator kind 'cube'; kinds: sum, difference"):
        calculator_request(rng, "cube")
    with pytest.raises(TaskDataError, match="allowed kinds are sum, difference, product"):
        generate_tasks("calculator", 2, options={"kinds": ["sum", "root"]})


def test_multistep_generator_is_consistent():
    for task in generate_tasks("multistep", 20, seed=0):
        gt = task.ground_truth
        first, second = task.extra_info["keys"]
        calc1, put1, calc2, put2 = gt.tool_sequence
        product = evaluate(calc1.params["expression"])
        assert put1.params == {"key": first, "value": product}
        assert calc2.params["expression"].startswith(str(product))
        result = evaluate(calc2.params["expression"])
        assert put2.params == {"key": second, "value": result} and gt.success.answer == result
        assert gt.success.state == {"kv": {first: product, second: result}}
        assert {s.server for s in gt.tool_sequence} == {"calculator", "kv"}


def test_generator_errors():
    with pytest.raises(TaskDataError, match="unknown generator 'nope'; registered: .*calculator"):
        generate_tasks("nope", 1)
    with pytest.raises(TaskDataError, match="gave only 100 distinct questions"):
        generate_tasks("calculator", 101, options={"digits": 1})
    with pytest.raises(TaskDataError, match="bad options"):
        generate_tasks("calculator", 1, options={"colour": "red"})


def yes_no_tasks(rng: random.Random, prefix: str = "Is"):
    while True:
        n = rng.randint(0, 10**6)
        yield {"prompt": [{"role": "user", "content": f"{prefix} {n} even?"}],
               "reward_spec": {"method": "final_answer", "ground_truth": {
                   "task_id": "x", "complexity": "easy", "success": {"answer": "yes" if n % 2 == 0 else "no"}}}}


def test_custom_generator_by_path_and_by_registration(monkeypatch):
    tasks = generate_tasks("tests.test_data:yes_no_tasks", 5, seed=0, options={"prefix": "Is the number"})
    assert len(tasks) == 5 and tasks[0].question.startswith("Is the number ")
    assert tasks[0].task_id == "yes-no-tasks-train-s0-00000"
    monkeypatch.setitem(GENERATORS, "yes_no", GENERATORS.get("yes_no"))  # restored after the test
    register_generator("yes_no", yes_no_tasks)
    tasks = generate_tasks("yes_no", 5)
    assert tasks == generate_tasks("yes_no", 5) and tasks[0].task_id == "yes-no-train-s0-00000"


# -- split -----------------------------------------------------------------------------------

def questions(tasks) -> set[str]:
    return {normalize_question(t) for t in tasks}


def test_split_from_generator_never_shares_a_question():
    # 1-digit products: 100 questions, so the train and validation streams collide often.
    cfg = DataConfig(train=DatasetSource(generator="calculator", num_tasks=60, seed=0, options={"digits": 1}),
                     validation_size=40)
    train, validation = train_validation_split(cfg)
    assert len(train) == 60 and len(validation) == 40
    assert not questions(train) & questions(validation)
    assert validation[0].task_id.startswith("calculator-validation-")
    assert train_validation_split(cfg) == (train, validation)


def test_split_from_file_keeps_a_question_on_one_side(tmp_path):
    records = [record(f"t{i}", f"What is {i % 10} * 3?") for i in range(30)]  # each question 3 times
    path = write_jsonl(tmp_path / "tasks.jsonl", records)
    cfg = DataConfig(train=DatasetSource(path=str(path)), validation_size=4)
    train, validation = train_validation_split(cfg)
    assert len(questions(validation)) == 4 and len(validation) == 12 and len(train) == 18
    assert not questions(train) & questions(validation)
    with pytest.raises(TaskDataError, match="10 distinct questions cannot give 10 held-out"):
        train_validation_split(DataConfig(train=DatasetSource(path=str(path)), validation_size=10))


def test_explicit_validation_drops_training_questions(tmp_path, caplog):
    train_path = write_jsonl(tmp_path / "train.jsonl", [record("a", "What is 1 * 1?"), record("b", "What is 2 * 2?")])
    val_path = write_jsonl(tmp_path / "val.jsonl", [record("c", "what is 2 * 2"), record("d", "What is 3 * 3?")])
    cfg = DataConfig(train=DatasetSource(path=str(train_path)), validation=DatasetSource(path=str(val_path)))
    with caplog.at_level(logging.WARNING):
        _, validation = train_validation_split(cfg)
    assert [t.task_id for t in validation] == ["d"] and "dropped 1 validation task" in caplog.text
    cfg = DataConfig(train=DatasetSource(path=str(train_path)), validation=DatasetSource(path=str(train_path)))
    with pytest.raises(TaskDataError, match="nothing is held out"):
        train_validation_split(cfg)


def test_explicit_generator_validation_uses_the_validation_stream():
    cfg = DataConfig(train=DatasetSource(generator="calculator", num_tasks=20),
                     validation=DatasetSource(generator="calculator", num_tasks=10))  # same seed
    train, validation = train_validation_split(cfg)
    assert len(validation) == 10 and not questions(train) & questions(validation)


# -- hostile input (issue 15): every bad record, unknown environments, encodings --------------

def test_unknown_env_class_names_file_line_value_and_registered(tmp_path):
    records = [record(f"t{i}", f"What is {i} * 3?") for i in range(1, 5)]
    records[2]["env_class"] = "mcp_env"
    path = write_jsonl(tmp_path / "tasks.jsonl", records)
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(path)))
    assert str(info.value) == (f"{path} line 3: env_class: got 'mcp_env'; registered: "
                               f"{', '.join(registered_ids())} (or set environment.env_class for every task)")
    # `environment.env_class` overrides every task's own: the tasks' values are then not used.
    assert len(load_tasks(DatasetSource(path=str(path)), env_class="mcp_tool")) == 4
    cfg = DataConfig(train=DatasetSource(path=str(path)), validation_size=1)
    with pytest.raises(TaskDataError, match="line 3: env_class: got 'mcp_env'"):
        train_validation_split(cfg)
    assert len(train_validation_split(cfg, env_class="mcp_tool")[0]) == 3


def test_every_bad_record_is_reported_with_file_line_and_field(tmp_path):
    bad_env = record("t5", "What is 5 * 3?")
    bad_env["env_class"] = "nope"
    lines = [record("t1"), "{not json", record("t3", "What is 3 * 3?", complexity="extreme"),
             record("t4", "What is 4 * 3?"), bad_env, record("t1", "What is 6 * 3?"), "[1, 2]"]
    path = write_jsonl(tmp_path / "tasks.jsonl", lines)
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(path)))
    registered = ", ".join(registered_ids())
    assert str(info.value) == "\n".join([
        f"{path}: 5 bad records",
        f"  {path} line 2: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)",
        f"  {path} line 3: reward_spec.ground_truth.complexity: got 'extreme'; allowed: easy, medium, hard",
        (f"  {path} line 5: env_class: got 'nope'; registered: {registered} (or set environment.env_class for "
         "every task)"),
        f"  {path} line 6: reward_spec.ground_truth.task_id: 't1' is already used at {path} line 1",
        f"  {path} line 7: expected an object, got list",
    ])


def test_many_bad_records_show_the_first_twenty_and_the_count(tmp_path):
    lines = [record(f"t{i}", f"What is {i} * 3?", complexity="extreme") for i in range(25)]
    path = write_jsonl(tmp_path / "tasks.jsonl", lines)
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(path)))
    text = str(info.value).splitlines()
    assert text[0] == f"{path}: 25 bad records (the first 20 below)"
    assert text[1] == f"  {path} line 1: reward_spec.ground_truth.complexity: got 'extreme'; allowed: easy, medium, hard"
    assert text[20].startswith(f"  {path} line 20: ") and text[21:] == ["  ... and 5 more"]


def test_non_utf8_files_name_the_file_and_line(tmp_path):
    lines = [json.dumps(record(f"t{i}", f"What is {i} * 3?")) for i in range(1, 5)]
    data = ("\n".join(lines) + "\n").encode().replace(b"What is 3 * 3", b"What is 3 \xd7 3")  # latin-1 ×
    (tmp_path / "tasks.jsonl").write_bytes(data)
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(tmp_path / "tasks.jsonl")))
    column = lines[2].index("3 * 3") + 3
    assert str(info.value) == (f"{tmp_path / 'tasks.jsonl'} line 3: not UTF-8 text (byte 0xd7 at column "
                               f"{column}); save the file as UTF-8")
    (tmp_path / "tasks.json").write_bytes(b"[\n" + data.replace(b"}\n{", b"},\n{") + b"]")
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(tmp_path / "tasks.json")))
    assert str(info.value) == (f"{tmp_path / 'tasks.json'} line 4: not UTF-8 text (byte 0xd7 at column "
                               f"{column}); save the file as UTF-8")
    # A byte-order mark (what some editors write first) is no error.
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode())
    assert len(load_tasks(DatasetSource(path=str(tmp_path / "bom.jsonl")))) == 4


# -- hostile input (issue 43): a folder, every error of a record at once, defaults ------------

def test_a_folder_given_as_the_dataset_is_named_a_folder(tmp_path):
    (tmp_path / "tasks").mkdir()
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(tmp_path / "tasks")))
    assert str(info.value) == (f"task file {str(tmp_path / 'tasks')!r} is a directory; give a .jsonl, .json or "
                               ".parquet file of task records")


def test_all_of_a_records_errors_come_at_once(tmp_path):
    registered = ", ".join(registered_ids())
    bad = record("t1", "What is 1 * 3?", complexity="extreme")
    bad["env_class"] = "mcp_env"
    dup = record("t1", "What is 2 * 3?")
    dup["reward_spec"]["method"] = ["state", "limits"]
    dup["reward_spec"]["weights"] = {"judge": 1.0}
    short_form = {"question": "What is 4 * 3?", "tool_sequence": [{"tool": "calculate"}], "anwser": 12,
                  "complexity": "extreme"}
    bad_shape = {"question": "", "tool_sequence": {"tool": "calculate"}, "anwser": 12}
    path = write_jsonl(tmp_path / "tasks.jsonl", [bad, dup, short_form, bad_shape])
    with pytest.raises(TaskDataError) as info:
        load_tasks(DatasetSource(path=str(path)))
    unknown = f"unknown field(s) ['anwser'] in a tool-sequence record; allowed: {sorted(SHORT_FORM_FIELDS)}"
    assert str(info.value) == "\n".join([
        f"{path}: 4 bad records",
        f"  {path} line 1: reward_spec.ground_truth.complexity: got 'extreme'; allowed: easy, medium, hard",
        f"    env_class: got 'mcp_env'; registered: {registered} (or set environment.env_class for every task)",
        (f"  {path} line 2: reward_spec: method 'state' needs ground_truth.success.state or .checks; method 'limits' needs "
         "ground_truth.limits; weights for ['judge'] which are not in method ['state', 'limits']"),
        f"    reward_spec.ground_truth.task_id: 't1' is already used at {path} line 1",
        f"  {path} line 3: {unknown}",
        "    reward_spec.ground_truth.complexity: got 'extreme'; allowed: easy, medium, hard",
        f"  {path} line 4: {unknown}",
        "    question: a tool-sequence record needs a non-empty question",
        "    tool_sequence: needs a non-empty list of {server, tool, params} steps",
    ])


@pytest.mark.parametrize("steps, complexity", [(0, "easy"), (1, "easy"), (3, "medium"), (4, "hard")])
def test_complexity_defaults_to_the_length_of_the_tool_sequence(steps, complexity):
    sequence = [{"tool": "calculate", "params": {"expression": f"{i} + 1"}} for i in range(steps)]
    bare = record(tool_sequence=sequence)
    del bare["reward_spec"]["ground_truth"]["complexity"]
    assert Task.from_record(bare, "x").complexity == complexity
    if steps:
        assert Task.from_record({"question": "What is 1 + 1?", "tool_sequence": sequence}, "x").complexity == complexity
