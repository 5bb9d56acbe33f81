"""Execution-feedback RL (the paper's step 4): pure algorithm pieces (`algos`), Buffered Dynamic Retry (`bdr`), the
multi-turn rollout (`rollout`), generation engines (`engines`), settings (`config`),
the single-node TRL trainer (`trainer`) and the verl (Ray) adapter (`verl_adapter`). Heavy libraries (trl, verl)
are imported by the modules that need them. Verdicts come through `musacoder.api.Verifier`."""
