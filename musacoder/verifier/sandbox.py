"""Sandbox of a candidate process: it writes nothing but its private directory, and reaches no process but its own.

**Processes** (`own_namespace`, applied first). The candidate becomes PID 1 of a PID namespace of its own, with a mount
namespace in which a fresh /proc lists only that namespace and /tmp is its own (an overlay of the real one: a fixed
`/tmp/...` build path works, and what it writes there reaches nobody else). It cannot name, signal, trace or list
the judge, the reference, other candidates or anyone else's jobs (a candidate that found the reference through
/proc and stopped it while it was timed got `ok` at 17.6x on the cpu), and every process it starts dies with it:
double fork, setsid or clearing the subreaper flag leave the process in the namespace, where the judge counts it.
Made with privileges where the process has them (root), else inside a user namespace of its own; where neither is
allowed it runs without, and says so.

**Files** (`restrict_writes`): Linux Landlock (unprivileged, kernel >= 5.13) through the `landlock` library. The
process may read what it needs (Python, torch, its built libraries) but write only its private directory and the
device nodes; the verifier's caches, other jobs' buffers and the judge's files are out of reach. It cannot list the
shared-memory root where the judges' buffer directories live: buffer files have secret names, and a listing is how a
candidate found the reference's output buffer and returned it as its own. Landlock also keeps it from tracing any
process outside its own sandbox (ptrace, /proc/PID/maps, mem, environ), and from kernel 6.12 (Landlock ABI 6) its
scopes keep it from signalling such a process or connecting to its abstract unix sockets: without the PID namespace
these still stop the attacks above, though /proc still lists the other processes. The `landlock` library (1.0.0.dev5,
the newest) knows no scopes, so they are a second ruleset made through the two raw system calls (a stable kernel ABI).
Applied first thing in the process, before any thread exists (Landlock binds the calling thread and its future
children only).

The judge and the reference subject also make themselves non-dumpable (`hide_process`) and the candidate drops every
capability: reading a non-dumpable process's /proc entries then needs CAP_SYS_PTRACE, which it no longer has, even as
root. Each step's outcome is part of the description the verdict carries (`details.sandbox`)."""

from __future__ import annotations

import ctypes
import errno
import glob
import os
import signal
from pathlib import Path

from musacoder.proc.scratch import shm_root


def restrict_writes(private_dir: str, also: list[str] = ()) -> str:
    """Deny every write outside `private_dir`, `also` and device nodes, and (Landlock ABI >= 6) every signal or
    abstract-socket connection to a process outside this sandbox. Returns a description for the verdict."""
    # the landlock library tells a failed call by ctypes' errno, not by its result: an earlier failure (an unshare
    # refused before a user namespace was made) would read as its own
    ctypes.set_errno(0)
    try:
        from landlock import FSAccess, Ruleset, landlock_abi_version

        abi = landlock_abi_version()
    except Exception as e:  # no library, no kernel support
        return f"no landlock ({type(e).__name__}: {str(e)[:80]}); {drop_capabilities()}"
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
    scopes = _scope_signals_and_sockets(abi, [private_dir, *also])
    caps = drop_capabilities()
    return (f"landlock abi {abi}: writes only to its private directory" + "".join(f" and {d}" for d in also)
            + f"; cannot list {shm_root()}; cannot trace processes outside its sandbox; {scopes}; {caps}")


_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1, 2
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_RESTRICT_SELF = 444, 446  # the same on every Linux architecture


class _ScopedRulesetAttr(ctypes.Structure):
    """struct landlock_ruleset_attr as of ABI 6: handled_access_fs, handled_access_net, scoped."""
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


def _scope_signals_and_sockets(abi: int, writable: list[str]) -> str:
    """A second Landlock layer: no signal and no connection to an abstract unix socket leaves the sandbox (its own
    processes are inside it). Moving a file into another directory ("refer") is refused by every layer that does not
    grant it, whatever the layer handles, so this one grants it beneath the directories the first lets it write:
    without that, Triton's cache (a file written in a subdirectory, renamed up) failed with EXDEV."""
    if abi < 6:
        return f"signals not scoped (landlock abi {abi} < 6: kernel before 6.12)"
    from landlock.plumbing import FSAccess, PathBeneathAttr, get_add_rule

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    attr = _ScopedRulesetAttr(FSAccess.REFER, 0, _SCOPE_SIGNAL | _SCOPE_ABSTRACT_UNIX_SOCKET)
    fd = libc.syscall(ctypes.c_long(_SYS_LANDLOCK_CREATE_RULESET), ctypes.byref(attr),
                      ctypes.c_size_t(ctypes.sizeof(attr)), ctypes.c_uint32(0))
    if fd < 0:
        return f"signals not scoped (landlock_create_ruleset: {os.strerror(ctypes.get_errno())})"
    try:
        for path in writable:
            path_fd = os.open(path, os.O_PATH)
            try:
                get_add_rule()(fd, 1, ctypes.byref(PathBeneathAttr(FSAccess.REFER, path_fd)), 0)
            finally:
                os.close(path_fd)
        # no_new_privs is already set: the file ruleset's apply() set it
        if libc.syscall(ctypes.c_long(_SYS_LANDLOCK_RESTRICT_SELF), ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            return f"signals not scoped (landlock_restrict_self: {os.strerror(ctypes.get_errno())})"
    finally:
        os.close(fd)
    return "cannot signal processes or reach abstract unix sockets outside its sandbox"


_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID = 0x00020000, 0x10000000, 0x20000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
_PR_SET_PDEATHSIG = 1


def own_namespace(private_dir: str) -> tuple[int, str, list[str]]:
    """Make the rest of this program run as PID 1 of a new PID namespace, in a new mount namespace with a fresh /proc
    and a private /tmp. Forks: the calling process stays behind, waits for the new one and ends as it ended (its
    parent's handle on it stays valid); only the new process returns. Returns its pid as the processes outside see
    it (the one to signal), a description for the verdict and the directories besides `private_dir` it may write
    (/tmp). Where no namespace can be made, nothing forks: (this process's pid, why, [])."""
    libc = ctypes.CDLL(None, use_errno=True)
    made = _unshare(libc)
    if made.startswith("no "):
        return os.getpid(), made, []
    waiter = os.getpid()
    child = os.fork()
    if child:
        _wait_then_end_as(child)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # fork cleared it: die with the waiter
    # the old /proc still names processes as the parent namespace does: this one's pid there, and its parent's
    outside = int(os.readlink("/proc/self"))
    with open("/proc/self/stat") as f:
        if int(f.read().rsplit(")", 1)[1].split()[1]) != waiter:  # the waiter died before PDEATHSIG was set
            os._exit(1)
    mounts, writable = _private_mounts(libc, private_dir)
    return outside, f"{made}; {mounts}", writable


def _unshare(libc) -> str:
    """New PID and mount namespaces for this process's next child: with privileges, else in a user namespace of
    its own (unprivileged, where the system allows it). A description, "no ..." where neither could be made."""
    if libc.unshare(_CLONE_NEWPID | _CLONE_NEWNS) == 0:
        return "pid namespace of its own: sees and signals only its own processes, which die with it"
    first = os.strerror(ctypes.get_errno())
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(_CLONE_NEWUSER | _CLONE_NEWPID | _CLONE_NEWNS) != 0:
        return (f"no pid namespace (unshare: {first}; in a user namespace: {os.strerror(ctypes.get_errno())}): "
                "it could see the other processes, and a process it starts could leave its tree")
    # the same ids inside as outside (files it writes keep their owner); an unprivileged process must give up
    # setgroups before it may map its group
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        try:
            Path(f"/proc/self/{name}").write_text(text)
        except OSError as e:
            if name != "setgroups" or e.errno != errno.ENOENT:  # kernels before 3.19 have no setgroups file
                return (f"no pid namespace (user namespace {name}: {e.strerror}): it could see the other processes, "
                        "and a process it starts could leave its tree")
    return "pid namespace of its own (in a user namespace): sees and signals only its own processes, which die with it"


def _wait_then_end_as(child: int):
    """The waiter: nothing but wait for the subject and end as it did (its exit code, or the signal that ended it).
    Non-dumpable: its environment names the private directory, and mirroring a crash must not write a core file."""
    ctypes.CDLL(None).prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # the subject's socket closes when the subject ends
    code = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _private_mounts(libc, private_dir: str) -> tuple[str, list[str]]:
    """In the new mount namespace (nothing propagates out): a private /tmp, then a fresh /proc for the new PID
    namespace. The private /tmp is an overlay on the real one: everything there stays readable (the build cache, a
    checkout or a virtualenv may live under /tmp), writes land in a tmpfs of its own that dies with the namespace.
    Its private directory, where that lies under /tmp, is mounted again at its own path (writes there must reach the
    real directory: the judge reads buffers in it). A description and the directories it may write besides its
    private one."""
    def mount(source, target, fstype, flags, data=None) -> str:
        if libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                      data and data.encode()) != 0:
            return f"mount {fstype or target}: {os.strerror(ctypes.get_errno())}"
        return ""

    err = mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    if err:
        return f"{err}: /proc still lists the other processes (it cannot signal them); no private /tmp", []
    private = os.path.realpath(private_dir)
    layer = os.path.join(private, ".tmp")  # its own tmpfs, beside nothing of the overlay's lower layer
    os.makedirs(layer, exist_ok=True)
    fd = os.open(private, os.O_PATH)
    try:
        err = mount("tmpfs", layer, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0700,size=2g")  # RAM, outside its caps
        if not err:
            os.mkdir(f"{layer}/upper")
            os.mkdir(f"{layer}/work")
            err = mount("overlay", "/tmp", "overlay", _MS_NOSUID | _MS_NODEV,
                        f"lowerdir=/tmp,upperdir={layer}/upper,workdir={layer}/work")
        if not err and private.startswith("/tmp/"):
            err = mount(f"/proc/self/fd/{fd}", private, None, _MS_BIND)
    finally:
        os.close(fd)
    tmp, writable = (f"no private /tmp ({err})", []) if err else \
        ("a private /tmp (what it writes there stays its own)", ["/tmp"])
    err = mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    seen = f"{err}: /proc still lists the other processes (it cannot signal them)" if err else \
        "/proc lists only its own processes"
    return f"{seen}; {tmp}", writable


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
