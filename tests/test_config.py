import pytest
import yaml

from environments.base import registered_ids
from grpo.algorithm.config import GAEConfig
from grpo.config import ConfigError, RunConfig, load_config, parse_override, save_config


def test_defaults_and_dotted_overrides_parse_values_as_yaml():
    cfg = load_config(None, ["algorithm.reference.kl_coef=0.05", "train.steps=3", "lora.enabled=true",
                             "lora.target_modules=[q_proj, v_proj]"])
    assert cfg.algorithm.reference.kl_coef == 0.05
    assert cfg.train.steps == 3
    assert cfg.lora.enabled is True
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]


def test_bad_choice_names_the_field_and_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.reference.kl=sometimes"])
    assert "algorithm.reference.kl: got 'sometimes'; allowed values: 'off', 'loss' or 'reward'" in str(err.value)


def test_unknown_key_and_bad_device_are_named():
    with pytest.raises(ConfigError, match=r"algorithm\.reference\.kl_coeff: unknown key"):
        load_config(None, ["algorithm.reference.kl_coeff=0.1"])
    with pytest.raises(ConfigError, match=r"device: got 'tpu'; allowed values: 'auto', 'cpu', 'cuda' or 'mps'"):
        load_config(None, ["device=tpu"])
    with pytest.raises(ConfigError, match=r"rollout\.engine: got 'tgi'; allowed values: 'auto', 'hf', 'vllm' or 'vllm_server'"):
        load_config(None, ["rollout.engine=tgi"])


def test_an_engine_batch_larger_than_the_episodes_in_flight_is_refused_with_both_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.hf.max_batch_size=128"])  # max_concurrent_episodes: 64
    assert ("rollout.hf.max_batch_size 128 is more than rollout.max_concurrent_episodes 64: the collector "
            "never has more than 64 requests in flight") in str(err.value)
    assert "set rollout.max_concurrent_episodes to at least 128" in str(err.value)
    paired = load_config(None, ["rollout.hf.max_batch_size=128", "rollout.max_concurrent_episodes=128"])
    assert paired.rollout.hf.max_batch_size == 128
    # The HF engine's section does not matter to vLLM; null resolves per device (64 on a CPU).
    assert load_config(None, ["rollout.hf.max_batch_size=128", "rollout.engine=vllm"]).rollout.hf.max_batch_size == 128
    assert load_config(None, []).rollout.hf.max_batch_size is None


def test_advantage_is_a_union_on_the_estimator():
    cfg = load_config(None, ["algorithm.advantage.estimator=gae", "algorithm.advantage.gamma=1.0"])
    assert (cfg.algorithm.advantage.estimator, cfg.algorithm.advantage.gamma) == ("gae", 1.0)
    assert cfg.algorithm.advantage.lam == GAEConfig().lam  # the default
    assert load_config(None, ["algorithm.advantage=rloo"]).algorithm.advantage.estimator == "rloo"
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.advantage.gamma=0.9"])  # gamma belongs to gae only
    assert ("algorithm.advantage.gamma: unknown key for estimator 'grpo' (gamma exists only "
            "with estimator: gae)") in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.advantage=ppo"])
    assert "algorithm.advantage.estimator: got 'ppo'; allowed values: 'grpo', 'dr_grpo', 'rloo', 'turn_grpo', 'gae'" in str(err.value)


def test_keys_from_an_older_release_name_their_new_place():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["backend=hf", "algorithm.kl_in_reward=true", "algorithm.micro_batch_size=4"])
    text = str(err.value)
    assert "keys from an older release" in text
    assert "backend: moved; `backend` was split in two: `device: auto|cpu|cuda|mps`" in text
    assert "hf -> device=cuda rollout.engine=hf" in text
    assert "algorithm.kl_in_reward: moved; algorithm.reference.kl: reward (or loss, or off)" in text
    assert "algorithm.micro_batch_size: moved; algorithm.optimizer.micro_batch_size" in text
    with pytest.raises(ConfigError, match="vllm.enabled: moved; use `rollout.engine: hf`"):
        load_config(None, ["vllm.enabled=false"])


def test_the_engine_sections_sit_under_rollout():
    cfg = load_config(None, ["rollout.hf.fuse_norms=false", "rollout.vllm.gpu_memory_utilization=0.5"])
    assert (cfg.rollout.hf.fuse_norms, cfg.rollout.vllm.gpu_memory_utilization) == (False, 0.5)
    with pytest.raises(ConfigError) as err:
        load_config(None, ["hf.fuse_norms=false", "vllm.dtype=bfloat16", "vllm_server.urls=[http://a:1]"])
    assert "hf: moved; rollout.hf (the HF engine's section sits under rollout:)" in str(err.value)
    assert "vllm: moved; rollout.vllm (the vLLM engine's section sits under rollout:)" in str(err.value)
    assert "vllm_server: moved; rollout.vllm_server (the vLLM servers' section sits under rollout:)" in str(err.value)
    with pytest.raises(ConfigError, match=r"rollout\.hf\.park_steps: Input should be greater than or equal to 0"):
        load_config(None, ["rollout.hf.park_steps=-1"])


def test_out_of_range_value_is_named():
    with pytest.raises(ConfigError, match=r"algorithm\.group_size: Input should be greater than or equal to 2"):
        load_config(None, ["algorithm.group_size=1"])


def test_yaml_file_errors_name_the_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(bad)
    bad.write_text("algorithm: {kl_coef: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_override_syntax_errors():
    with pytest.raises(ConfigError, match="not of the form"):
        parse_override("algorithm.kl_coef")
    with pytest.raises(ConfigError, match="empty key part"):
        parse_override("algorithm..kl_coef=1")
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(None, ["seed=1", "seed.x=2"])


def test_combinations_are_checked():
    with pytest.raises(ConfigError, match="load_in_4bit needs lora.enabled"):
        load_config(None, ["model.load_in_4bit=true"])
    with pytest.raises(ConfigError, match="gae needs model.value_head"):
        load_config(None, ["algorithm.advantage=gae", "model.value_head=false"])


def test_saved_config_masks_secrets_and_round_trips(tmp_path):
    cfg = RunConfig.model_validate({
        "tools": {"servers": {"search": {"command": "search-server", "env": {"API_KEY": "sk-secret"}},
                              "remote": {"transport": "http", "url": "http://127.0.0.1:1/mcp",
                                         "headers": {"Authorization": "Bearer tok"}}}}})
    path = tmp_path / "config.yaml"
    save_config(cfg, path)
    text = path.read_text()
    assert "sk-secret" not in text and "Bearer tok" not in text
    saved = yaml.safe_load(text)
    assert saved["tools"]["servers"]["search"]["env"] == {"API_KEY": "***"}
    assert saved["tools"]["servers"]["remote"]["headers"] == {"Authorization": "***"}
    assert cfg.tools.servers["search"].env == {"API_KEY": "sk-secret"}  # the live config keeps it


def test_shipped_configs_validate():
    for name in ("cpu", "smoke"):
        cfg = load_config(f"configs/{name}.yaml")
        assert cfg.run_name


def test_readme_dataset_override_replaces_the_generator_of_the_file(tmp_path):
    # configs/cpu.yaml trains on `generator: calculator`; the README tells users to point it at files.
    cfg = load_config("configs/cpu.yaml", ["data.train.path=my_tasks.jsonl", "data.validation.path=my_val.jsonl"])
    assert (cfg.data.train.path, cfg.data.train.generator, cfg.data.train.options) == ("my_tasks.jsonl", None, {})
    assert cfg.data.train.seed == 0 and cfg.data.validation.path == "my_val.jsonl"
    # ...and the other way round; a section written as null takes keys too.
    path_config = tmp_path / "files.yaml"
    path_config.write_text("data:\n  train: {path: tasks.jsonl}\n  validation: null\n")
    cfg = load_config(path_config, ["data.train.generator=calculator", "data.validation.path=val.jsonl"])
    assert (cfg.data.train.generator, cfg.data.train.path) == ("calculator", None)
    assert cfg.data.validation.path == "val.jsonl"
    # Both in one source is still an error.
    with pytest.raises(ConfigError, match="a dataset source needs exactly one of `path` or `generator`"):
        load_config(None, ["data.train={path: a.jsonl, generator: calculator}"])


def test_unknown_env_class_in_the_config_lists_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        load_config("configs/smoke.yaml", ["environment.env_class=mcp_env"])
    assert str(err.value) == ("invalid config (configs/smoke.yaml):\n  environment.env_class: got 'mcp_env'; "
                              f"registered: {', '.join(registered_ids())}")
    assert load_config(None, ["environment.env_class=bfcl"]).environment.env_class == "bfcl"


def test_unknown_keys_get_a_did_you_mean_in_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.reference.kl_coeff=0.1", "algoritm.group_size=4",
                           "tools.servers={calc: {command: python, comand: x}}"])
    assert str(err.value).splitlines()[1:] == [
        "  algorithm.reference.kl_coeff: unknown key (did you mean 'kl_coef'?)",
        "  tools.servers.calc.comand: unknown key (did you mean 'command'?)",
        "  algoritm: unknown key (did you mean 'algorithm'?)",
    ]
    path = tmp_path / "run.yaml"
    path.write_text("trian: {steps: 2}\nrollout: {max_new_tokns: 8, zzz: 1}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).splitlines()[1:] == [
        "  rollout.max_new_tokns: unknown key (did you mean 'max_new_tokens'?)",
        "  rollout.zzz: unknown key",
        "  trian: unknown key (did you mean 'train'?)",
    ]
    # In the advantage union the estimator decides which keys exist.
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.advantage.normalise_std=false"])
    assert "algorithm.advantage.normalise_std: unknown key for estimator 'grpo' (did you mean 'normalize_std'?)" in str(
        err.value)


def test_a_folder_given_as_the_config_is_named_a_folder(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert str(err.value) == f"config file {tmp_path} is a directory; give a YAML file"
