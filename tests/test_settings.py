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
