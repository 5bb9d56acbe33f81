"""settings.py: one loader for every config."""

import pytest

from musacoder.config import VerifyConfig


def test_one_settings_loader_for_every_config(tmp_path):
    """Verification, SFT, RFT and RL settings load through one typed loader: nested settings from their type hints,
    lists to declared tuples, unknown keys refused with their path."""
    from musacoder.settings import Settings
    from musacoder.train.rft import RFTConfig
    from musacoder.train.rl.config import RLConfig
    from musacoder.train.sft import SFTConfig

    assert all(issubclass(c, Settings) for c in (VerifyConfig, SFTConfig, RFTConfig, RLConfig))
    v = VerifyConfig.from_dict({"correctness": {"rescale_factors": [2, 4]}, "timing": {"max_reps": 9}})
    assert v.correctness.rescale_factors == (2, 4) and v.timing.max_reps == 9
    assert VerifyConfig.from_dict(v.to_dict()).to_dict() == v.to_dict()
    with pytest.raises(ValueError, match="under timing: \\['max_rep'\\]"):
        VerifyConfig.from_dict({"timing": {"max_rep": 9}})
    p = tmp_path / "sft.yaml"
    p.write_text("output_dir: out\ndata: [x.jsonl]\ninit: {}\nlora: {enabled: true, r: 4}\n")
    cfg = SFTConfig.from_yaml(p, output_dir="elsewhere")
    assert cfg.lora.r == 4 and cfg.lora.enabled and cfg.output_dir == "elsewhere"
    with pytest.raises(ValueError, match="unknown SFTConfig setting"):
        SFTConfig.from_yaml(p, learning_rat=1e-5)


def test_sub_configs_fail_at_load_not_in_a_worker():
    from musacoder.train.rl.config import RLConfig

    with pytest.raises(ValueError, match=r"under verify: \['timng_enabled'\]"):
        RLConfig(model="m", verify={"timng_enabled": False})
    with pytest.raises(ValueError, match=r"under warm_start: \['epoch'\]"):
        RLConfig(warm_start={"epoch": 1})
    with pytest.raises(ValueError, match="max_turns"):  # built in Python, a sub-config gets its ranges too
        RLConfig(model="m", max_turns=0)
    from musacoder.train.rl.bdr import BDRSettings

    with pytest.raises(ValueError):
        BDRSettings(prob=2.0)


def test_sub_configs_are_typed_once_loaded(tmp_path):
    """`verify:` and `warm_start:` are written as mappings and held as settings: a VerifyConfig (RFT's with timing off
    unless it says otherwise) and the warm start's SFT settings, type errors naming their path."""
    import yaml

    from musacoder.train.rft import RFTConfig
    from musacoder.train.rl.config import RLConfig, WarmStartSettings
    from musacoder.train.sft import SFTConfig

    p = tmp_path / "rl.yaml"
    p.write_text("warm_start: {init: {model_type: llama}, data: [d.jsonl], lora: {enabled: true}}\n"
                 "verify: {backend: cpu, devices: [0, 0], correctness: {seeds: 2}}\n")
    cfg = RLConfig.from_yaml(p, ["verify.timing_enabled=false"])
    assert isinstance(cfg.verify, VerifyConfig) and cfg.verify.devices == (0, 0) and not cfg.verify.timing_enabled
    assert cfg.verify.correctness.seeds == 2
    ws = cfg.warm_start
    assert isinstance(ws, WarmStartSettings) and isinstance(ws, SFTConfig) and ws.lora.enabled
    assert [d.path for d in ws.data] == ["d.jsonl"]  # as before: relative to the current directory
    assert (ws.output_dir, ws.seed) == (None, None)  # the RL run's
    assert isinstance(RLConfig(model="m").verify, VerifyConfig)
    # saved next to a run (rl_config.yaml), the config loads back the same
    assert RLConfig.from_dict(yaml.safe_load(yaml.safe_dump(cfg.to_dict()))) == cfg

    with pytest.raises(ValueError, match="setting verify.correctness.seeds: input should be greater than or equal"):
        RLConfig.from_dict({"model": "m", "verify": {"correctness": {"seeds": 0}}})
    with pytest.raises(ValueError, match="setting warm_start.learning_rate: input should be a valid number"):
        RLConfig(warm_start={"init": {}, "learning_rate": "fast"})
    with pytest.raises(ValueError, match="^warm_start: give exactly one of `model`"):  # at load, not after RL starts
        RLConfig(warm_start={"num_train_epochs": 2})

    assert not RFTConfig(model="replay:x").verify.timing_enabled
    r = RFTConfig.from_dict({"model": "replay:x", "verify": {"backend": "cpu"}})
    assert isinstance(r.verify, VerifyConfig) and not r.verify.timing_enabled and r.verify.backend == "cpu"
    assert RFTConfig(model="replay:x", verify={"timing_enabled": True}).verify.timing_enabled
    assert RFTConfig.from_dict(yaml.safe_load(yaml.safe_dump(r.to_dict()))) == r
    with pytest.raises(ValueError, match=r"under verify: \['timng_enabled'\]"):
        RFTConfig(model="replay:x", verify={"timng_enabled": False})
