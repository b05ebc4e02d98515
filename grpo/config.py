"""The typed run configuration: `RunConfig` assembles each component's section, loaded from YAML.

`load_config(path, overrides)` reads a YAML file, applies dotted CLI overrides such as
`algorithm.reference.kl_coef=0.05`, and validates the result. Unknown keys and bad values are
errors that name the field (and, for choices, the allowed values; for unknown keys, the closest
known one); a key that moved in a release is an error naming its new place (`MOVED_KEYS`).
`RunConfig.dump_masked()` is what a run saves beside its outputs: secrets (server env values,
HTTP headers) are masked.

The sections live beside what they configure: grpo/models/config.py (`model`, `lora`),
grpo/algorithm/config.py (`algorithm`), grpo/rollout/config.py (`rollout` with its engines'
`rollout.hf`, `rollout.vllm` and `rollout.vllm_server`),
grpo/train/config.py (`train`, `logging`), tools/config.py (`tools`), environments/config.py
(`environment`, `data`).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from environments.config import DataConfig, EnvironmentConfig
from grpo.algorithm.config import AlgorithmConfig, GAEConfig
from grpo.models.config import Device, LoraConfig, ModelConfig
from grpo.rollout.config import RolloutConfig
from grpo.sections import Section
from grpo.train.config import LoggingConfig, TrainConfig
from tools.config import ToolsConfig
from tools.secrets import mask_value


class RunConfig(Section):
    run_name: str = "run"
    """Name of the run; outputs go to `<output_dir>/<run_name>/`."""
    output_dir: str = "outputs"
    """Parent directory of run directories."""
    seed: int = 0
    """Seed for sampling, data order and initialisation."""
    device: Device = "auto"
    """Where the policy trains. `auto`: CUDA (the local rank's GPU), else MPS, else CPU. The
    rollout engine is `rollout.engine`; several processes are `launch/distributed.py`'s job."""
    threads: int | None = Field(default=None, ge=1)
    """torch intra-op threads on CPU (null = the number of cores)."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    lora: LoraConfig = Field(default_factory=LoraConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    tools: ToolsConfig = Field(default_factory=ToolsConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @model_validator(mode="after")
    def _check_combinations(self) -> RunConfig:
        if self.model.load_in_4bit and not self.lora.enabled:
            raise ValueError("model.load_in_4bit needs lora.enabled: 4-bit base weights cannot be trained")
        if isinstance(self.algorithm.advantage, GAEConfig) and not self.model.value_head:
            raise ValueError("algorithm.advantage.estimator=gae needs model.value_head: true")
        if (self.algorithm.advantage.estimator == "turn_grpo" and self.environment.turn_credit == "off"
                and self.environment.env_class in (None, "mcp_tool")):
            raise ValueError("algorithm.advantage.estimator=turn_grpo needs per-turn credit: set "
                             "environment.turn_credit: verified (calls checked against each task's gold chain)")
        rows, in_flight = self.rollout.hf.max_batch_size, self.rollout.max_concurrent_episodes
        if rows is not None and self.rollout.engine in ("auto", "hf") and rows > in_flight:
            raise ValueError(
                f"rollout.hf.max_batch_size {rows} is more than rollout.max_concurrent_episodes {in_flight}: "
                f"the collector never has more than {in_flight} requests in flight, so the HF engine's "
                f"batch would never fill; set rollout.max_concurrent_episodes to at least {rows}, or "
                f"rollout.hf.max_batch_size to at most {in_flight}")
        if self.rollout.hf.decode_mode == "graph" and self.device in ("cpu", "mps"):
            raise ValueError(f"rollout.hf.decode_mode=graph needs device cuda (or auto), not {self.device}")
        if self.rollout.engine == "vllm" and self.device == "mps":
            raise ValueError("rollout.engine=vllm runs on device cuda or cpu (vLLM has no MPS build), not mps")
        if self.rollout.engine == "vllm_server" and not self.rollout.vllm_server.urls:
            raise ValueError("rollout.engine=vllm_server needs rollout.vllm_server.urls (the servers' base URLs)")
        problem = name_problem(self.run_name)
        if problem:
            raise ValueError(f"run_name {self.run_name!r} {problem}")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir) / self.run_name

    def dump_masked(self) -> dict[str, Any]:
        """The resolved config as plain data, with every secret value replaced by '***': server
        env values and headers whole, and anything else the secrets rule catches (a key in a
        server's args, a password in a URL; tools/secrets.py)."""
        data = self.model_dump(mode="json")
        for server in data.get("tools", {}).get("servers", {}).values():
            for key in ("env", "headers"):
                if server.get(key):
                    server[key] = {k: "***" for k in server[key]}
        return mask_value(data)[0]


def name_problem(name: str) -> str | None:
    """Why `name` cannot be one path segment inside a run's directory (a run name, a transcript
    name): only letters, digits, '.', '_', '-', and not `.` or `..`, so that no name reaches a
    parent, an absolute path or another directory. None when it can."""
    if not re.fullmatch(r"[A-Za-z0-9._-]+", name):
        return "may hold only letters, digits, '.', '_', '-' (it names one directory or file, never a path)"
    if set(name) == {"."}:
        return "would name the directory itself or its parent, not one inside it"
    return None


_BACKEND_MOVED = (
    "`backend` was split in two: `device: auto|cpu|cuda|mps` (where the policy trains) and "
    "`rollout.engine: auto|hf|vllm` (what samples). backend cpu -> device=cpu; mps -> device=mps; "
    "hf -> device=cuda rollout.engine=hf; vllm -> device=cuda rollout.engine=vllm; deepspeed -> "
    "run `accelerate launch --config_file configs/accelerate_zero3.yaml launch/distributed.py`; "
    "auto -> delete the key"
)
MOVED_KEYS: dict[str, str] = {
    "backend": _BACKEND_MOVED,
    "vllm.enabled": "use `rollout.engine: hf` (or the ENABLE_VLLM=0 environment variable)",
    "hf": "rollout.hf (the HF engine's section sits under rollout:)",
    "vllm": "rollout.vllm (the vLLM engine's section sits under rollout:)",
    "vllm_server": "rollout.vllm_server (the vLLM servers' section sits under rollout:)",
    "algorithm.normalize_std": "algorithm.advantage.normalize_std",
    "algorithm.gamma": "algorithm.advantage.gamma (with algorithm.advantage.estimator: gae)",
    "algorithm.lam": "algorithm.advantage.lam (with algorithm.advantage.estimator: gae)",
    "algorithm.clip_low": "algorithm.loss.clip_low",
    "algorithm.clip_high": "algorithm.loss.clip_high",
    "algorithm.dual_clip": "algorithm.loss.dual_clip",
    "algorithm.value_coef": "algorithm.loss.value_coef",
    "algorithm.value_clip": "algorithm.loss.value_clip",
    "algorithm.entropy_coef": "algorithm.loss.entropy_coef",
    "algorithm.loss_agg": "algorithm.loss.loss_agg",
    "algorithm.skip_zero_advantage": "algorithm.loss.skip_zero_advantage",
    "algorithm.kl_coef": "algorithm.reference.kl_coef (0 is now algorithm.reference.kl: off)",
    "algorithm.kl_estimator": "algorithm.reference.kl_estimator",
    "algorithm.kl_in_reward": "algorithm.reference.kl: reward (or loss, or off)",
    "algorithm.ref_ema_decay": "algorithm.reference.ema_decay",
    "algorithm.ref_update_every": "algorithm.reference.update_every",
    "algorithm.ref_offload_to_cpu": "algorithm.reference.offload_to_cpu",
    "algorithm.learning_rate": "algorithm.optimizer.learning_rate",
    "algorithm.weight_decay": "algorithm.optimizer.weight_decay",
    "algorithm.warmup_steps": "algorithm.optimizer.warmup_steps",
    "algorithm.max_grad_norm": "algorithm.optimizer.max_grad_norm",
    "algorithm.ppo_epochs": "algorithm.optimizer.ppo_epochs",
    "algorithm.num_minibatches": "algorithm.optimizer.num_minibatches",
    "algorithm.micro_batch_size": "algorithm.optimizer.micro_batch_size",
}
"""Keys that moved, by their old dotted name: what to write instead."""


def moved_keys(data: dict[str, Any]) -> list[str]:
    """One line per old key present in `data`: `old: moved; new place`."""
    found = []
    for old, new in MOVED_KEYS.items():
        node: Any = data
        for part in old.split("."):
            node = node.get(part, _ABSENT) if isinstance(node, dict) else _ABSENT
        if node is not _ABSENT:
            found.append(f"  {old}: moved; {new}")
    return found


_ABSENT = object()


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field and the problem."""


class DuplicateKey(yaml.YAMLError):
    """A mapping in YAML that holds one key twice (YAML itself would keep the last silently)."""

    def __init__(self, key: Any, first_line: int, line: int):
        super().__init__(f"key {key!r} appears twice in one mapping (lines {first_line} and {line}); "
                         "remove one")
        self.key, self.first_line, self.line = key, first_line, line


class UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises DuplicateKey for a key given twice in one mapping: a config
    that sets `group_size` twice means one of them, and silently taking the last hides which."""


def _construct_unique_mapping(loader: UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue  # `<<: *base` then overriding a key of base is what merge keys are for
        key, line = loader.construct_object(key_node, deep=True), key_node.start_mark.line + 1
        try:
            duplicate = key in seen
        except TypeError:  # an unhashable key: construct_mapping names it
            continue
        if duplicate:
            raise DuplicateKey(key, seen[key], line)
        seen[key] = line
    return loader.construct_mapping(node, deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def load_yaml(text: str) -> Any:
    """YAML text as data, refusing duplicate keys (DuplicateKey); every config YAML reads here."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: safe


def parse_override(text: str) -> tuple[list[str], Any]:
    """`algorithm.kl_coef=0.05` -> (['algorithm', 'kl_coef'], 0.05); values parse as YAML."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form dotted.key=value")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r} has an empty key part")
    try:
        value = load_yaml(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: value is not valid YAML ({exc})") from None
    return parts, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set each `dotted.key=value` in the raw config data, in order. A section that is absent or
    null is created. Where the section's class declares `OVERRIDE_REPLACES` (e.g. a dataset
    source: `path` replaces `generator`), setting such a key drops the keys it replaces, so an
    override can switch what the file chose instead of adding a contradiction to it."""
    for text in overrides:
        parts, value = parse_override(text)
        node = data
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        if value is not None:
            replaces = getattr(_section_class(parts[:-1]), "OVERRIDE_REPLACES", {})
            for key in replaces.get(parts[-1], ()):
                node.pop(key, None)
        node[parts[-1]] = value
    return data


@dataclass
class _KeyPlace:
    """Where a dotted key lives: the config class that should hold it, the key as the user writes
    it (without the union tags pydantic puts into error locations), and the union it crossed."""

    section: type[BaseModel] | None
    path: list[str] = field(default_factory=list)
    tag: tuple[str, str] | None = None
    """(discriminator, value) of the last union crossed, e.g. ("estimator", "grpo")."""
    other_members: list[type[BaseModel]] = field(default_factory=list)


def _options(annotation: Any) -> list[Any]:
    """The types a field allows: a union's members without None, else the annotation itself."""
    if get_origin(annotation) in (Union, UnionType):
        return [a for a in get_args(annotation) if a is not type(None)]
    return [annotation]


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [t for t in _options(annotation) if isinstance(t, type) and issubclass(t, BaseModel)]


def _containers(annotation: Any) -> tuple[Any, int]:
    """The annotation of a field's items (dict values, list items, nested), and how many location
    parts (keys, indexes) they take."""
    taken, options = 0, _options(annotation)
    while len(options) == 1 and get_origin(options[0]) in (dict, list):
        annotation, taken = get_args(options[0])[-1], taken + 1
        options = _options(annotation)
    return annotation, taken


def _key_place(loc: tuple | list) -> _KeyPlace:
    """Walk `loc` (a dotted key as parts, or a pydantic error location) from RunConfig through
    sections, dict values, list items and tagged unions."""
    place = _KeyPlace(RunConfig)
    parts = [str(p) for p in loc]
    i = 0
    while i < len(parts) and place.section is not None:
        info = place.section.model_fields.get(parts[i])
        if info is None:
            return _KeyPlace(None)
        annotation, taken = _containers(info.annotation)
        place.path += parts[i:i + 1 + taken]
        i += 1 + taken
        members = _models(annotation)
        if len(members) > 1 and info.discriminator and i < len(parts):  # pydantic puts the tag next
            tag = parts[i]
            chosen = [m for m in members if tag in get_args(m.model_fields[info.discriminator].annotation)]
            place.tag, i = (info.discriminator, tag), i + 1
            place.other_members = [m for m in members if m not in chosen]
            members = chosen
        place.section = members[0] if len(members) == 1 else None
    return place


def _section_class(parts: list[str]) -> type[BaseModel] | None:
    """The config class of the section at the dotted path `parts` (None where there is no one
    class, e.g. a union such as `algorithm.advantage`, or no such section)."""
    return _key_place(parts).section


def _unknown_key(loc: tuple) -> tuple[str, str]:
    """(dotted key, message) for a key no section declares: a did-you-mean among the keys of its
    section; in a tagged union, which member declares it."""
    place, key = _key_place(loc[:-1]), str(loc[-1])
    dotted = ".".join([*place.path, key]) if place.section is not None else ".".join(map(str, loc))
    message = "unknown key" if place.tag is None else f"unknown key for {place.tag[0]} {place.tag[1]!r}"
    if place.section is None:
        return dotted, message
    close = difflib.get_close_matches(key, list(place.section.model_fields), n=1)
    owners = [t for m in place.other_members if key in m.model_fields
              for t in get_args(m.model_fields[place.tag[0]].annotation)]
    if close:
        message += f" (did you mean {close[0]!r}?)"
    elif owners:
        message += f" ({key} exists only with {place.tag[0]}: {', '.join(owners)})"
    return dotted, message


def _format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        field_name = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            field_name, msg = _unknown_key(err["loc"])
        elif err["type"] == "union_tag_invalid":
            field_name = f"{field_name}.{err['ctx']['discriminator'].strip(chr(39))}"
            msg = f"got {err['ctx']['tag']!r}; allowed values: {err['ctx']['expected_tags']}"
        elif err["type"] == "literal_error" and "expected" in err.get("ctx", {}):
            msg = f"got {err.get('input')!r}; allowed values: {err['ctx']['expected']}"
        lines.append(f"  {field_name}: {msg}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    moved = moved_keys(data)
    if moved:
        raise ConfigError("\n".join([f"invalid config ({source}): keys from an older release", *moved]))
    try:
        return RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc, source)) from None


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> RunConfig:
    """Read a YAML run config (or the defaults when path is None) and apply dotted overrides."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        path = Path(path)
        source = str(path)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory; give a YAML file")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            loaded = load_yaml(path.read_text())
        except DuplicateKey as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        data = loaded or {}
    data = apply_overrides(data, overrides or [])
    return config_from_dict(data, source)


def save_config(config: RunConfig, path: str | Path) -> None:
    """Write the resolved config, secrets masked, as YAML."""
    Path(path).write_text(yaml.safe_dump(config.dump_masked(), sort_keys=False))
