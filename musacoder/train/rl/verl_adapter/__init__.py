"""Multi-node RL through verl (Ray): the same PrimeEcho, BDR and MirrorPop, plugged into verl's extension points.

Importing this package registers (set `VERL_USE_EXTERNAL_MODULES=musacoder.train.rl.verl_adapter` so every verl
process imports it; configs/verl/ has an example), one file each, as verl lays out its own extensions:
- agent loop `musacoder_agent` (`agent_loop.KernelAgentLoop`): the multi-turn rollout against the verifier; the
  output is the first turn only (the policy gradient goes through it alone) and carries the PrimeEcho reward, so
  verl's reward loop is skipped. It reports each trajectory to the BDR buffer.
- reward manager `musacoder` (`reward_manager.MooreEvalRewardManager`): one verification per response, for
  single-turn runs with verl's own single-turn agent loop.
- `dataset.BDRDataset` (`data.custom_cls`): verl's RLHFDataset whose items become repair tasks with probability p,
  drawn from one Ray actor that holds the buffer (`buffer.RetryBufferActor`). verl repeats a dataset item
  rollout.n times, so a whole group gets the same repair task.
- policy loss `mirrorpop` (`loss.py`): drops sequences whose mean |log rho| exceeds delta, with rho the token ratio
  pi_train / pi_rollout that verl hands the loss as `rollout_is_weights` (algorithm.rollout_correction.rollout_is:
  token, with a threshold that never truncates); then verl's vanilla clipped loss on what is kept.
Settings come from `reward.reward_kwargs.musacoder` of the verl config (`common.VerlSettings`), MirrorPop's from the
actor's `policy_loss` node (`MirrorPopLossConfig`, see `mirrorpop_policy_loss`).
"""

from musacoder.train.rl.verl_adapter.agent_loop import KernelAgentLoop
from musacoder.train.rl.verl_adapter.buffer import RetryBufferActor, buffer_actor
from musacoder.train.rl.verl_adapter.common import VerlSettings, task_rows
from musacoder.train.rl.verl_adapter.dataset import BDRDataset
from musacoder.train.rl.verl_adapter.loss import MirrorPopLossConfig, mirrorpop_policy_loss, mirrorpop_settings
from musacoder.train.rl.verl_adapter.reward_manager import MooreEvalRewardManager

__all__ = ["BDRDataset", "KernelAgentLoop", "MirrorPopLossConfig", "MooreEvalRewardManager", "RetryBufferActor",
           "VerlSettings", "buffer_actor", "mirrorpop_policy_loss", "mirrorpop_settings", "task_rows"]
