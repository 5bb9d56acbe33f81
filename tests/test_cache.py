"""verifier/cache.py: the SQLite caches the pool's admission reads and writes (prebuild outcomes, baselines)."""

import threading

from musacoder.verifier.cache import Cache


def test_entries_survive_a_reopen_and_tables_are_apart(tmp_path):
    c = Cache(tmp_path / "sub" / "c.sqlite")  # its directory is made
    c.put("prebuild", "k", {"build_error": None, "kernels": ["relu_kernel"]})
    c.put("baseline", "k", {"ms": 1.5})
    c.put("prebuild", "k", {"build_error": "error: x"})  # a later outcome replaces the earlier one
    c.close()
    c = Cache(tmp_path / "sub" / "c.sqlite")
    assert c.get("prebuild", "k") == {"build_error": "error: x"} and c.get("baseline", "k") == {"ms": 1.5}
    assert c.get("prebuild", "missing") is None
    c.clear("prebuild")
    assert c.get("prebuild", "k") is None and c.get("baseline", "k") == {"ms": 1.5}
    c.close()


def test_threads_share_one_cache(tmp_path):
    c = Cache(tmp_path / "c.sqlite")

    def write(t):
        for i in range(50):
            c.put("prebuild", f"{t}-{i}", {"i": i})

    threads = [threading.Thread(target=write, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(c.get("prebuild", f"{t}-{i}") == {"i": i} for t in range(4) for i in range(50))
    c.close()
