"""Filesystem sandbox of a candidate process: Linux Landlock (unprivileged, kernel >= 5.13) through the `landlock`
library. The process may read what it needs (Python, torch, its built libraries) but write only its private
directory and the device nodes; the verifier's caches, other jobs' buffers and the judge's files are out of reach.
It cannot list the shared-memory root where the judges' buffer directories live: buffer files have secret names,
and a listing is how a candidate found the reference's output buffer and returned it as its own.
Applied first thing in the process, before any thread exists (Landlock binds the calling thread and its future
children only). Without Landlock (older kernels, other systems) the process runs unsandboxed and says so.

Landlock still lets a sandboxed process read another process's /proc/PID/maps, fd/ and environ (Linux 6.18): the
judge's memory map named the reference's output buffer file, and a candidate returned it as its own. So the judge
and the reference subject make themselves non-dumpable (`hide_process`) and the candidate drops every capability:
reading a non-dumpable process's /proc entries then needs CAP_SYS_PTRACE, which it no longer has, even as root."""

from __future__ import annotations

import ctypes
import glob
import os
import tempfile
from pathlib import Path


def shm_root() -> Path:
    """Where the judges' buffer directories live (as files on the cpu)."""
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def restrict_writes(private_dir: str, also: list[str] = ()) -> str:
    """Deny every write outside `private_dir`, `also` and device nodes. Returns a description for the verdict."""
    try:
        from landlock import FSAccess, Ruleset, landlock_abi_version

        abi = landlock_abi_version()
    except Exception as e:  # no library, no kernel support
        return f"none ({type(e).__name__}: {str(e)[:80]})"
    # reads of files and execution stay open; ioctl on devices too (CUDA drives the GPU through ioctl on /dev/nvidia*)
    handled = FSAccess.all() & ~(FSAccess.READ_FILE | FSAccess.EXECUTE)
    if abi >= 5:
        handled &= ~FSAccess.IOCTL_DEV
    rs = Ruleset(restrict_rules=handled)
    rs.allow(private_dir, *also)
    for d in _listable_beside(shm_root()):
        try:
            rs.allow(d, rules=FSAccess.READ_DIR)
        except Exception:  # vanished, or not something a rule can be put on
            pass
    file_rights = handled & FSAccess.all_file()
    for dev in ["/dev/null", "/dev/zero", "/dev/full", *glob.glob("/dev/nvidia*"), *glob.glob("/dev/mtgpu*")]:
        try:
            rs.allow(dev, rules=file_rights)
        except Exception:
            pass
    rs.apply()
    caps = drop_capabilities()
    return (f"landlock abi {abi}: writes only to its private directory" + "".join(f" and {d}" for d in also)
            + f"; cannot list {shm_root()}; {caps}")


_PR_SET_DUMPABLE, _PR_CAPBSET_DROP, _CAP_VERSION_3 = 4, 24, 0x20080522


def hide_process() -> None:
    """Make this process's /proc entries (memory map, open files, environment) unreadable to processes without
    CAP_SYS_PTRACE. Also disables core dumps of this process."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def drop_capabilities() -> str:
    """Drop every capability of this process for good (bounding set, then effective/permitted/inheritable):
    a root candidate could otherwise read the judge's /proc entries through CAP_SYS_PTRACE."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):  # past the last capability the kernel knows, prctl fails with EINVAL: harmless
        libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(_CAP_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # two {effective, permitted, inheritable} words, all zero
    if libc.capset(header, data) != 0:
        return f"capabilities kept (capset failed: errno {ctypes.get_errno()})"
    return "no capabilities"


def _listable_beside(hidden: Path) -> list[str]:
    """Directories whose listing stays allowed: every directory beside each step of the path to `hidden` (a Landlock
    rule covers everything beneath its directory, so `hidden` is left out by allowing only its siblings)."""
    hidden = hidden.resolve()
    out = []
    for parent, step in zip([hidden, *hidden.parents][::-1], [*hidden.parts[1:], None]):
        if step is None:
            break
        try:
            out += [str(e) for e in parent.iterdir() if e.name != step and e.is_dir()]
        except OSError:
            pass
    return out
