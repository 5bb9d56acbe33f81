"""Cluster mode on a Ray cluster of three simulated nodes on this machine (cpu backend): the head runs the compile
actor, two nodes each advertise one `musacoder_device`. Nodes have separate build caches, so artifacts really travel
through the object store. A node is removed while it runs a job: everything still gets a verdict, and the verdicts
equal the one-node pool's for the same inputs."""

import time

import pytest
from test_faults_cpu import BAD_CPP, HANG, IMPORT_RAISES
from test_faults_cpu import HONEST as PLAIN_COPY

from musacoder.config import VerifyConfig
from musacoder.examples_catalog import EXAMPLES_DIR
from musacoder.pool.local import LocalPool
from musacoder.tasks import builtin_task

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

from musacoder.pool.ray_cluster import DEVICE_RESOURCE, RayPool  # noqa: E402


def _cases():
    relu = builtin_task("level1/19_ReLU")
    honest = (EXAMPLES_DIR / "cpu/honest_relu.py").read_text()
    return [(relu, honest), (relu, HANG), (relu, "no code here"), (relu, honest), (relu, IMPORT_RAISES),
            (relu, (EXAMPLES_DIR / "cpu/exploit_01_fallback_relu.py").read_text()), (relu, BAD_CPP), (relu, PLAIN_COPY),
            (relu, "```python\nimport subprocess\n```"), (relu, honest)]


def _key(v):
    return (v.status.value, v.reason, v.candidate_hash, v.trials_passed, v.trials_total, v.illegal_ops)


@pytest.fixture(scope="module")
def cfg(cache_dir):
    return VerifyConfig(backend="cpu", cache_dir=cache_dir, timing_enabled=False, run_timeout_s=15)


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = [c.add_node(num_cpus=1, resources={DEVICE_RESOURCE: 1}) for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    yield c, nodes
    ray.shutdown()
    c.shutdown()


@pytest.mark.slow  # CI time: ~2.5 min of CI's 2 cores (three Ray nodes, a node's own builds); `make test-all`
def test_cluster_matches_one_node_and_survives_a_lost_node(cluster, cfg):
    c, nodes = cluster
    cases = _cases()
    with LocalPool(cfg, compile_workers=2) as local:
        expected = {i: _key(v) for i, v in local.verify_many(cases)}

    with RayPool(cfg, address=c.address) as pool:
        got, stats = _run_and_remove_a_node(pool, c, nodes, cases)
        served = _through_the_service(pool, [cases[i] for i in (0, 2, 5)])
    assert got == expected  # nothing lost, nothing altered
    assert stats["infra_retries"] >= 1 and stats["completed"] == len(cases)
    assert expected[0][0] == "ok" and expected[1][0] == "timeout" and expected[4][0] == "runtime_error"
    assert served == [expected[i][0] for i in (0, 2, 5)]  # the HTTP service fronts the cluster pool too


def _through_the_service(pool, cases):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from musacoder.service.app import create_app
    from musacoder.service.settings import ServiceSettings

    with TestClient(create_app(pool, ServiceSettings(db_path=pool.cfg.cache_dir / "ray-service.sqlite"))) as c:
        out = []
        for task, cand in cases:
            r = c.post("/v1/jobs?wait=60", json={"task": {"name": task.name, "code": task.code, "level": task.level},
                                                 "candidate": cand})
            out.append(r.json()["verdict"]["status"])
        return out


def _run_and_remove_a_node(pool, c, nodes, cases):
    assert pool.n_devices == 2 and pool.n_compile == 1
    futures = [pool.submit(t, cand, i) for i, (t, cand) in enumerate(cases)]
    # wait until a device job is running on one of the two device nodes, then take that node away
    deadline, victim = time.monotonic() + 300, None
    while victim is None and time.monotonic() < deadline:
        for kind, actor, _job in list(pool._inflight.values()):
            if kind == "device":
                victim = pool._hello[actor].node
        time.sleep(0.2)
    assert victim is not None
    c.remove_node(next(n for n in nodes if n.node_id == victim), allow_graceful=False)

    got = {i: _key(f.result(timeout=600)) for i, f in enumerate(futures)}
    return got, pool.stats()
