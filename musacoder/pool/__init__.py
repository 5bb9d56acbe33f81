"""Worker pools that run the verifier: `LocalPool` (one node) and `RayPool` (a Ray cluster, optional extra)."""

from __future__ import annotations


def make_pool(config=None, ray_address: str | None = None, **kwargs):
    """The one-node pool, or the Ray cluster pool when `ray_address` is given ("auto", "ray://host:10001", ...).

    Both offer submit(task, candidate) -> Future[Verdict], verify_many, stats(), wait_ready() and close().
    """
    if ray_address:
        from musacoder.pool.ray_cluster import RayPool

        return RayPool(config, address=ray_address, **kwargs)
    from musacoder.pool.local import LocalPool

    return LocalPool(config, **kwargs)
