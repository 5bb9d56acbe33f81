"""RFT: structural clustering on hand-made near-duplicates and distinct implementations; the diversity comparison;
end to end on the cpu backend with a generator client that mixes honest, broken and cheating candidates."""

import json
from pathlib import Path

import pytest

pytest.importorskip("datasketch")

from musacoder.bench.clients.base import Client, Generation  # noqa: E402
from musacoder.data.diversity import ClusterSettings, cluster, mean_pairwise_distance, normalise, shingles  # noqa: E402
from musacoder.data.records import Record, load_records  # noqa: E402
from musacoder.train.data import mix  # noqa: E402
from musacoder.train.rft import RFTConfig, compare_diversity, run_rft  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "musacoder" / "examples" / "cpu"
RELU = (EXAMPLES / "honest_relu.py").read_text()
# The same kernel with other names, comments, a docstring and another literal: a near-duplicate.
RELU_RENAMED = '"""My ReLU."""\n# first try\n' + RELU.replace("relu_ext", "my_ext").replace("xc", "src").replace(
    "const int64_t n", "// element count\n    const int64_t count").replace("i < n", "i < count").replace(
    "0.f ? in[i] : 0.f", "0.0f ? in[i] : 0.0f")
# A different strategy for the same task: 2-D accessors, collapsed loops, std::max, a row-parallel wrapper.
RELU_ROWS = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

SRC = r"""
#include <torch/extension.h>
#include <algorithm>

torch::Tensor relu_rows(torch::Tensor x) {
    auto y = torch::empty({x.size(0), x.size(1)}, x.options());
    auto a = x.accessor<float, 2>();
    auto b = y.accessor<float, 2>();
    #pragma omp parallel for collapse(2) schedule(static)
    for (int64_t r = 0; r < x.size(0); ++r)
        for (int64_t c = 0; c < x.size(1); ++c)
            b[r][c] = std::max(a[r][c], 0.0f);
    return y;
}
"""

ext = load_inline(name="relu_rows", cpp_sources=SRC, functions=["relu_rows"],
                  extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"])


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        shape = x.shape
        return ext.relu_rows(x.reshape(-1, shape[-1]).contiguous()).view(shape)
'''
SOFTMAX = (EXAMPLES / "honest_softmax.py").read_text()


def test_normalisation_ignores_names_comments_and_literals():
    assert normalise(RELU) == normalise(RELU_RENAMED)
    assert normalise(RELU) != normalise(RELU_ROWS)
    assert "threadIdx" in normalise("__global__ void k(float* p) { p[threadIdx.x] = 0; }")
    assert "ID" in normalise(RELU) and "NUM" in normalise(RELU) and "omp" in normalise(RELU)


def test_clusters_group_near_duplicates_and_split_distinct_implementations():
    codes = [RELU, RELU_ROWS, RELU_RENAMED, SOFTMAX, RELU_ROWS.replace("schedule(static)", "")]
    assert cluster(codes) == [0, 1, 0, 2, 1]
    assert cluster(codes, ClusterSettings(threshold=0.2)) == [0, 0, 0, 0, 0]  # the threshold is a real setting
    assert cluster([]) == [] and cluster([RELU]) == [0]
    assert mean_pairwise_distance([RELU, RELU_RENAMED]) == 0.0
    assert mean_pairwise_distance([RELU, RELU_ROWS]) > 0.4
    assert mean_pairwise_distance([RELU]) == 0.0 and len(shingles("a b", k=5)) == 1


def answer(code: str) -> str:
    return f"<think>Elementwise, one pass.</think>\n```python\n{code}\n```"


def test_diversity_compares_pools_with_best_only():
    def rec(code, c):
        return Record([{"role": "user", "content": "q"}, {"role": "assistant", "content": answer(code)}],
                      metadata={"pool": "t", "cluster": c})

    pools = {"t": [rec(RELU, 0), rec(RELU_RENAMED, 0), rec(RELU_ROWS, 1)], "u": [rec(SOFTMAX, 0)]}
    d = compare_diversity(pools, epochs=8, seed=0, by_cluster=True)
    assert d["pooled"]["targets"] == 4 and d["pooled"]["clusters"] == 3 and d["best_only"]["clusters"] == 2
    assert d["pooled"]["distinct_clusters_trained"] == 3 and d["best_only"]["distinct_targets_trained"] == 2
    assert d["pooled"]["mean_pairwise_distance"] > 0.1 and d["best_only"]["mean_pairwise_distance"] == 0.0


class MixedClient(Client):
    """Honest, near-duplicate, broken and cheating answers, chosen by (task, sample); counts what it is asked."""

    model_id = "test:mixed"

    def __init__(self):
        self.asked = 0
        cheat = (EXAMPLES / "exploit_01_fallback_relu.py").read_text()  # shares the honest kernel's build
        broken = ["I would write a kernel here.", answer("class ModelNew(nn.Module:\n    pass")]
        # Renamed in Python only: the C++ source, and so the one build, stays shared with RELU.
        renamed = "# mine\n" + RELU.replace("relu_ext", "my_relu").replace("(x)", "(inp)").replace("x:", "inp:")
        self.answers = {"level1/19_ReLU": [answer(RELU), answer(renamed), answer(cheat), broken[0],
                                           answer((EXAMPLES / "honest_relu_try_except.py").read_text())],
                        "level1/23_Softmax": broken * 3}

    def generate(self, requests):
        for i, r in enumerate(requests):
            self.asked += 1
            yield i, Generation(text=self.answers[r.task.key][r.sample])


def test_rft_end_to_end_on_the_cpu_backend(tmp_path, cache_dir):
    cfg = RFTConfig(model="test:mixed", output_dir=str(tmp_path / "rft"), names=["19_ReLU", "23_Softmax"],
                    samples=5, backend="cpu", preview_epochs=6,
                    verify={"timing_enabled": False, "cache_dir": cache_dir})
    client = MixedClient()
    report = run_rft(cfg, client=client)
    assert client.asked == 10
    assert report["tasks"] == 2 and report["tasks_with_pass"] == 1 and report["passed"] == 3
    relu, softmax = report["per_task"]
    assert relu["statuses"]["ok"] == 3 and relu["statuses"]["illegal"] == 1 and softmax["passed"] == 0
    assert relu["pool"] == 3 and relu["clusters"] == len(relu["cluster_sizes"]) and relu["cluster_sizes"][0] >= 2

    out = tmp_path / "rft"
    records, problems = load_records(out / "rft.jsonl")
    assert problems == [] and len(records) == 3
    by_sample = {r.metadata["sample"]: r for r in records}
    assert sorted(by_sample) == [0, 1, 4]  # the cheat (2) and the broken answer (3) are not in the pool
    assert by_sample[0].metadata["cluster"] == by_sample[1].metadata["cluster"]  # near-duplicates
    assert all(r.messages[-1]["content"] == client.answers["level1/19_ReLU"][s] for s, r in by_sample.items())
    assert by_sample[0].messages[0]["role"] == "system" and "ModelNew" in by_sample[0].messages[1]["content"]
    assert [len(item) for item in mix([str(out / "rft.jsonl")]).items] == [3]  # one pool for SFT to draw from
    best, _ = load_records(out / "best.jsonl")
    assert len(best) == 1 and best[0].pool is None and best[0].metadata["sample"] == 0
    d = report["diversity"]
    assert d["pooled"]["clusters"] >= d["best_only"]["clusters"] == 1
    assert d["pooled"]["mean_pairwise_distance"] > 0 == d["best_only"]["mean_pairwise_distance"]
    assert "| level1/19_ReLU | 5 | 3 | 3 |" in (out / "rft_report.md").read_text()

    again = MixedClient()  # resumed: every verdict is stored, nothing is generated or verified twice
    assert run_rft(cfg, client=again) == report and again.asked == 0
    assert json.loads((out / "rft_report.json").read_text()) == report
