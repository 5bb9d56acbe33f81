"""Generation clients and the model SPEC the CLI takes.

SPEC: `openai:MODEL@http://host:port/v1` (any OpenAI-compatible server: vLLM, SGLang, ...; without `@URL` the
server is http://localhost:8000/v1), `hf:/path/to/checkpoint` (local transformers), `replay:/path/to/file.jsonl`
(or a directory); baselines (clients/retrieval.py): `retrieval:TRAIN.jsonl` (the nearest training answer, renamed),
`fewshot:K:TRAIN.jsonl:SPEC` (the model of SPEC prompted with its K nearest training examples).
"""

from __future__ import annotations

from musacoder.bench.clients.base import Client, Generation, Request
from musacoder.bench.clients.replay import ReplayClient, ReplayError

__all__ = ["Client", "Generation", "ReplayClient", "ReplayError", "Request", "check_local_model", "make_client"]


def check_local_model(path: str) -> None:
    """A local model directory that is missing: say so, instead of transformers' Hub lookup error (a traceback about
    repo ids). A Hub id (`org/name`: one slash, not starting with . / ~) is left to transformers."""
    from pathlib import Path

    if not Path(path).expanduser().exists() and (path.startswith((".", "/", "~")) or path.count("/") != 1):
        raise ValueError(f"model directory {path} not found")


def make_client(spec: str, concurrency: int = 16, batch_size: int = 8, request_timeout: float | None = None,
                max_model_len: int | None = None) -> Client:
    """`concurrency` bounds requests in flight, `request_timeout` (s) each request, `max_model_len` the context in
    tokens (default: asked of the server) (openai); `batch_size` is the local generation batch (hf)."""
    kind, _, rest = spec.partition(":")
    if not rest:
        raise ValueError(f"model spec {spec!r}: expected openai:MODEL[@URL], hf:PATH or replay:PATH")
    if kind == "openai":
        from musacoder.bench.clients.openai import OpenAIClient, OpenAIConfig

        model, at, url = rest.rpartition("@") if "@http" in rest else (rest, "", "")
        cfg = OpenAIConfig(concurrency=concurrency, max_model_len=max_model_len or None,
                           **({"base_url": url} if at else {}),
                           **({"timeout_s": request_timeout} if request_timeout else {}))
        return OpenAIClient(model, cfg)
    if kind == "hf":
        from musacoder.bench.clients.hf import HFClient, HFConfig

        check_local_model(rest)
        return HFClient(rest, HFConfig(batch_size=batch_size))
    if kind == "replay":
        return ReplayClient(rest)
    if kind in ("retrieval", "fewshot"):  # baselines: nearest training answer; a model shown its nearest examples
        from musacoder.bench.clients.retrieval import from_spec

        return from_spec(kind, rest, lambda inner: make_client(inner, concurrency, batch_size, request_timeout,
                                                               max_model_len))
    raise ValueError(f"model spec {spec!r}: unknown kind {kind!r} (openai, hf, replay, retrieval or fewshot)")
