"""verifier/sandbox.py: Landlock write restriction and the hidden judge, each in a fresh process (what the candidate's
subject gets first thing; tests/test_trust_boundary.py attacks it through whole verifications)."""

import subprocess
import sys

import pytest


def test_sandbox_denies_writes_outside_the_private_directory(tmp_path):
    """Landlock in a fresh process: its private directory is writable, anything else is not."""
    private = tmp_path / "private"
    private.mkdir()
    code = ("import sys\nfrom musacoder.verifier.sandbox import restrict_writes\n"
            f"print(restrict_writes({str(private)!r}))\n"
            f"open({str(private / 'ok')!r}, 'w').write('x')\n"
            "try:\n    open(sys.argv[1], 'w').write('x')\n    print('WROTE')\nexcept PermissionError:\n    print('DENIED')\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "outside")], capture_output=True, text=True)
    assert "landlock" in out.stdout and "DENIED" in out.stdout, out.stdout + out.stderr
    assert (private / "ok").exists() and not (tmp_path / "outside").exists()


def test_a_candidate_cannot_read_a_hidden_process_proc_entries(tmp_path):
    """A hidden (non-dumpable) parent, as the judge is: its memory map, open files and environment are readable to an
    ordinary child and not to a sandboxed one, which has dropped its capabilities (as root it may still list fd/,
    not follow its links); its status stays public."""
    private = tmp_path / "private"
    private.mkdir()
    child = ("import os, sys\nfrom musacoder.verifier.sandbox import restrict_writes\n"
             f"if sys.argv[1] == 'sandboxed': print(restrict_writes({str(private)!r}))\n"
             "for e in ('maps', 'environ', 'fd', 'status'):\n"
             "    try:\n        p = f'/proc/{os.getppid()}/{e}'\n"
             "        [os.readlink(f'{p}/{n}') for n in os.listdir(p)] if e == 'fd' else open(p).read()\n        print(e, 'READ')\n"
             "    except PermissionError:\n        print(e, 'DENIED')\n")
    parent = ("import subprocess, sys\nfrom musacoder.verifier.sandbox import hide_process\nhide_process()\n"
              "for how in ('plain', 'sandboxed'):\n"
              "    print(how, subprocess.run([sys.executable, '-c', sys.argv[1], how], capture_output=True, text=True)"
              ".stdout.split(chr(10)))\n")
    out = subprocess.run([sys.executable, "-c", parent, child], capture_output=True, text=True)
    plain, sandboxed = out.stdout.splitlines()
    assert "'maps READ'" in plain and "'fd READ'" in plain, out.stdout + out.stderr
    assert "no capabilities" in sandboxed, sandboxed
    for e in ("maps", "environ", "fd"):
        assert f"'{e} DENIED'" in sandboxed, sandboxed
    assert "'status READ'" in sandboxed


# the sandbox as a kernel with Landlock ABI 1 makes it (Linux 5.13-5.18, e.g. Ubuntu 22.04's 5.15): no "refer" right
# (moving a file into another directory) can be granted there
_AS_ABI_1 = ("import landlock, landlock.plumbing\n"
             "landlock.plumbing.landlock_abi_version = landlock.landlock_abi_version = lambda: 1\n"
             "from musacoder.verifier.sandbox import restrict_writes\n")


def _in_abi1_sandbox(private, body: str) -> str:
    code = _AS_ABI_1 + f"print(restrict_writes({str(private)!r}))\nimport os\np = {str(private)!r}\n" + body
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "landlock abi 1" in out.stdout, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_files_are_written_in_place_where_landlock_cannot_grant_refer(tmp_path):
    """Triton's cache writes a file in a subdirectory and renames it up: EXDEV in such a sandbox. scratch.write_beside
    renames within one directory, which it allows."""
    private = tmp_path / "private"
    private.mkdir()
    out = _in_abi1_sandbox(private, (
        "os.makedirs(p + '/k/tmp.1')\nopen(p + '/k/tmp.1/a.so', 'w').write('x')\n"
        "try:\n    os.replace(p + '/k/tmp.1/a.so', p + '/k/a.so')\n    print('MOVED')\n"
        "except OSError as e:\n    print('REFUSED', e.errno == 18)\n"
        "from musacoder.proc.scratch import write_beside\nwrite_beside(p + '/k/b.so', b'bytes')\n"
        "print('BESIDE', open(p + '/k/b.so', 'rb').read(), sorted(os.listdir(p + '/k')))\n"))
    assert "REFUSED True" in out, out
    assert "BESIDE b'bytes' ['b.so', 'tmp.1']" in out, out


def test_the_triton_cache_of_a_subject_works_where_landlock_cannot_grant_refer(tmp_path):
    """The cache a subject's environment names (verifier.judge.private_env) stores and finds files in that sandbox."""
    pytest.importorskip("triton")  # not installed on the cpu CI; the GPU machine has it
    from musacoder.verifier.judge import private_env

    private = tmp_path / "private"
    private.mkdir()
    env = private_env(private)
    out = _in_abi1_sandbox(private, (
        f"os.environ.update({env!r})\n"
        "from triton.runtime.cache import get_cache_manager\n"
        "m = get_cache_manager('ab' * 32)\nprint(type(m).__name__)\n"
        "path = m.put(b'so', 'cuda_utils.so')\nm.put_group('k.json', {'cuda_utils.so': path})\n"
        "print('GOT', open(m.get_file('cuda_utils.so'), 'rb').read(), sorted(m.get_group('k.json')))\n"))
    assert "BesideCacheManager" in out and "GOT b'so' ['cuda_utils.so']" in out, out


def test_a_subject_moves_files_between_its_own_directories_and_links_in_nothing_from_outside(tmp_path):
    """The whole candidate sandbox (own namespaces, then Landlock with its scope layer), as the subject makes it. A
    file moves from one of its directories to another (Triton's cache does: EXDEV, H200 2026-11-29, while the scope
    layer granted no "refer"); a file from outside cannot be renamed or hard-linked in, which would give it a
    writable name for a file it may not write."""
    from landlock import landlock_abi_version

    if landlock_abi_version() < 6:
        pytest.skip("no Landlock scopes on this kernel (ABI < 6): no second layer")
    private = tmp_path / "private"
    private.mkdir()
    outside = tmp_path / "judge_file"
    outside.write_text("judge")
    code = ("import os, sys\nfrom musacoder.verifier.sandbox import own_namespace, restrict_writes\n"
            f"p, o = {str(private)!r}, {str(outside)!r}\n"
            "_, isolated, tmp = own_namespace(p)\nprint(restrict_writes(p, tmp))\n"
            "os.makedirs(p + '/k/tmp.1')\nopen(p + '/k/tmp.1/a.so', 'w').write('x')\n"
            "os.replace(p + '/k/tmp.1/a.so', p + '/k/a.so')\nprint('MOVED', os.listdir(p + '/k'))\n"
            "for how in (os.link, os.replace):\n"
            "    try:\n        how(o, p + '/mine')\n        print('TOOK', how.__name__)\n"
            "    except OSError as e:\n        print('REFUSED', how.__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    text = out.stdout + out.stderr
    assert "cannot signal processes" in text, text  # the scope layer is there
    assert "MOVED ['" in text and "a.so" in text, text
    assert "REFUSED link" in text and "REFUSED replace" in text, text
    assert outside.read_text() == "judge" and not (private / "mine").exists()
