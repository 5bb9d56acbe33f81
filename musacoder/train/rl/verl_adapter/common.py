"""The adapter's settings (`reward.reward_kwargs.musacoder`), dataset rows, and verifier access shared by the agent
loop and the reward manager."""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass, field

from musacoder.api import Verifier, get_verifier
from musacoder.config import VerifyConfig
from musacoder.conversation import task_messages
from musacoder.settings import Settings
from musacoder.tasks.model import Task
from musacoder.train.rl.bdr import BDRSettings
from musacoder.train.rl.config import PrimeEchoSettings
from musacoder.verifier.verdict import Verdict


@dataclass
class VerlSettings(Settings):
    verifier_url: str | None = None  # the reward service; None: the verifier's batch API inside the worker
    token_env: str = "MUSACODER_TOKEN"
    verify: VerifyConfig = field(default_factory=VerifyConfig)  # for the batch API
    max_turns: int = 3
    primeecho: PrimeEchoSettings = field(default_factory=PrimeEchoSettings)
    bdr: BDRSettings = field(default_factory=BDRSettings)
    bdr_state: str | None = None  # file the buffer actor keeps its state in (a resumed run reloads it)

    def __post_init__(self):
        super().__post_init__()
        if isinstance(self.verify, dict):  # built in Python from a mapping
            self.verify = VerifyConfig.from_dict(self.verify, "musacoder.verify.")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "verify": self.verify.to_dict()}  # VerifyConfig's own: cache_dir a string

    @classmethod
    def from_dict(cls, d, _path: str = "musacoder.") -> VerlSettings:
        """verl hands OmegaConf nodes: plain containers first, then the common loader. Errors name the settings'
        path as the verl config's `musacoder` node."""
        from omegaconf import OmegaConf

        return super().from_dict(OmegaConf.to_container(d, resolve=True) if OmegaConf.is_config(d) else dict(d), _path)

    @classmethod
    def from_config(cls, config) -> VerlSettings:
        """From the whole verl config: reward.reward_kwargs.musacoder."""
        return cls.from_dict((config.reward.get("reward_kwargs", None) or {}).get("musacoder", None) or {})


def task_rows(tasks: list[Task], backend: str, one_shot: bool = True) -> list[dict]:
    """verl dataset rows (write them to parquet): the prompt as the benchmark asks it, the task in extra_info."""
    return [{"data_source": "musacoder", "prompt": task_messages(t, backend, one_shot), "agent_name": "musacoder_agent",
             "reward_model": {"style": "verifier", "ground_truth": ""},
             "extra_info": {"index": i, "task": {"name": t.name, "code": t.code, "level": t.level,
                                                 "problem_id": t.problem_id}}}
            for i, t in enumerate(tasks)]


def task_of(info: dict) -> Task:
    """The task a row's extra_info carries."""
    return Task(**info["task"])


class SharedVerifier:
    """verl builds an agent loop per trajectory and a reward manager per worker: one verifier per class and process
    (verl's `init_class` convention; api.get_verifier, local or the service's, whose async client keeps its
    connections), replaced if the settings change, closed at exit or by `close_class()`."""

    _verifier: Verifier | None = None
    _settings: VerlSettings | None = None

    @classmethod
    def init_verifier(cls, s: VerlSettings) -> Verifier:
        if cls._verifier is None or cls._settings != s:
            if cls._verifier is None:
                atexit.register(cls.close_class)
            cls.close_class()
            cls._verifier = get_verifier(s.verify, s.verifier_url, os.environ.get(s.token_env))
            cls._settings = s
        return cls._verifier

    @classmethod
    def close_class(cls):
        v, cls._verifier = cls._verifier, None
        if v is not None:
            v.close()


async def verdict(v: Verifier, task: Task, text: str) -> Verdict:
    """One answer's verdict, from the agent loop or the reward manager."""
    return (await v.verdicts_async([(task, text)]))[0]
