import pytest
import yaml

from grpo.config import ConfigError, RunConfig, load_config, parse_override, save_config


def test_defaults_and_dotted_overrides_parse_values_as_yaml():
    cfg = load_config(None, ["algorithm.kl_coef=0.05", "train.steps=3", "lora.enabled=true",
                             "lora.target_modules=[q_proj, v_proj]"])
    assert cfg.algorithm.kl_coef == 0.05
    assert cfg.train.steps == 3
    assert cfg.lora.enabled is True
    assert cfg.lora.target_modules == ["q_proj", "v_proj"]


def test_bad_choice_names_the_field_and_the_allowed_values():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["algorithm.advantage=ppo"])
    assert "algorithm.advantage: got 'ppo'; allowed values: 'grpo', 'dr_grpo', 'rloo' or 'gae'" in str(err.value)


def test_unknown_key_and_bad_backend_are_named():
    with pytest.raises(ConfigError, match=r"algorithm\.kl_coeff: unknown key"):
        load_config(None, ["algorithm.kl_coeff=0.1"])
    with pytest.raises(ConfigError, match=r"backend: got 'tpu'; allowed values: 'auto', 'vllm', 'hf', 'deepspeed', 'mps' or 'cpu'"):
        load_config(None, ["backend=tpu"])


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
