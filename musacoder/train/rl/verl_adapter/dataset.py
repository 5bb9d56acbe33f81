"""`BDRDataset` (`data.custom_cls`): verl's RLHFDataset whose items become BDR repair tasks."""

from __future__ import annotations

import ray
from verl.utils.dataset.rl_dataset import RLHFDataset

from musacoder.tasks.model import Task
from musacoder.train.rl.bdr import RetryItem
from musacoder.train.rl.verl_adapter.buffer import buffer_actor
from musacoder.train.rl.verl_adapter.common import VerlSettings


class BDRDataset(RLHFDataset):
    """RLHFDataset whose item becomes, with BDR's probability, a repair task from the shared buffer. Its settings
    are the data config's `musacoder` node (the same as reward.reward_kwargs.musacoder); it talks to the buffer
    actor, so it needs data.dataloader_num_workers=0 (items built in the driver, which is connected to Ray)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.s = VerlSettings.from_dict(self.config.get("musacoder", None) or {})
        self.tasks = {Task(**info["task"]).key: info["task"] for info in self.dataframe["extra_info"]}

    def __getitem__(self, item):
        row = super().__getitem__(item)
        drawn = ray.get(buffer_actor(self.s).draw.remote()) if self.s.bdr.enabled else None
        if drawn:
            it = RetryItem(**drawn)
            row["raw_prompt"] = it.repair_messages()
            row["extra_info"] = {**row["extra_info"], "repair": True, "first_messages": it.messages,
                                 "history": [r.as_tuple() for r in it.repair_history()],
                                 "task": self.tasks[it.task]}
        return row
