"""verifier/sandbox.py: Landlock write restriction and the hidden judge, each in a fresh process (what the candidate's
subject gets first thing; tests/test_trust_boundary.py attacks it through whole verifications)."""

import subprocess
import sys


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
