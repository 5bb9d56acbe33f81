"""The timing window (judge's clock): rounds of one block per arm, in a secret order each round.

A block is one arm's calls back to back, `calls` of them, each on its own input set; the judge fills every set with
fresh values from new secret seeds before each round, so no call of a window sees inputs an earlier call saw, and
the sets together exceed twice the last-level cache, so each call reads its inputs from memory as a lone call after a
cache flush would. The judge's clock runs from a bare `go` to a bare `done` that the subject sends after
synchronising the device: one round trip a block instead of one a call, the same code on the reference's and the
candidate's side (subject.op_block), so a fast kernel is not buried under the protocol (a per-call round trip of
~1 ms pulled a 2.8x kernel to 0.84x on an H200). After `done` each call's output is read back into a row of the
judge's buffers and checked; the read-back is timed too, and a candidate whose read-back is clearly slower than the
reference's (work deferred past `done`) has its speed counted with the read-back on both sides. What the candidate
could do between its blocks is watched as before (quiet.py): its process stopped, and the device's quiet awaited or
(cpu) its CPU time sampled first.
"""

from __future__ import annotations

import functools
import math
import os
import random
import signal
import statistics
import time
from dataclasses import dataclass

import torch

from musacoder.proc.process import WorkerDied, WorkerTimeout, cpu_seconds, descendants, stop_and_wait
from musacoder.verifier import buffers
from musacoder.verifier.correctness import compare
from musacoder.verifier.inputs import Shape, fill_inputs, raw_inputs, tensor_bytes
from musacoder.verifier.protocol import SubjectCommand, SubjectReply, Timing
from musacoder.verifier.quiet import CpuGate, QuietGate
from musacoder.verifier.stages import stage
from musacoder.verifier.timing import (
    BLOCK_OVERRUN,
    CONTENDED_GRACES,
    LEFT_RUNNING_MS,
    block_limit_s,
    call_bytes,
    contended,
    faster_than_probed,
    held_in_plan,
    left_running,
    moved_out,
    net_block_ms,
    paired_speedup,
    plan_calls,
    probe_eight,
    rse,
)

# positions compared in each call's output row after a round, at most (every call's row is checked: a call the
# candidate skipped or deferred leaves its poisoned row)
SPOT_POSITIONS = 1 << 16
PROBES = (1, 1, 1, 8, 8, 8)  # calls of each probe block, in order (window._plan)


class ProbesOverran(RuntimeError):
    """The candidate's probe blocks ran past their bound (window._probe)."""


def _convicted(waits: dict[str, list[float]], elapsed_s: float, budget_s: float) -> bool:
    """Whether the quiet gate's waits already refuse the candidate for work left running, with the window's budget
    spent: more rounds cannot speed it up (a candidate that keeps the device busy makes every round slow: exploit 46
    ran a window into the job's 300 s limit on an H200). Four pairs at least; the same rule decides after the window."""
    return elapsed_s > budget_s and len(waits["cand"]) >= 4 and bool(left_running(waits["cand"], waits["ref"]))


@dataclass
class Block:
    """A timed block as the judge's clock saw it (ms): the calls (`go` to `done`), the subject's preparation
    (command to `ready`) and the read-back (`done` to the reply)."""

    ms: float = 0.0
    prepare_ms: float = 0.0
    readback_ms: float = 0.0
    reply: SubjectReply | None = None


class Window:
    def __init__(self, run, alone: bool):
        self.run, self.alone = run, alone
        self.j, self.cfg, self.f, self.rng = run.j, run.cfg, run.f, run.rng
        self.clock = {"ref": [], "cand": [], "comp": []}  # per block: the judge's clock (ms), counted rounds
        self.floor = 0.0  # the protocol's own cost a block (ms), taken off every block of every arm (_floor)
        self.outside = {"ref": [], "cand": []}  # per block: preparation + read-back (ms), counted rounds
        self.own: dict[str, list[float]] = {"ref": [], "cand": []}  # per block: its subject's own clock (ms)
        self.sets: dict[str, list] = {"ref": [], "cand": []}  # per set: the judge's tensors
        self.refs: dict[str, list] = {"ref": [], "cand": []}  # per set: what the subject opens
        self.rows: dict[str, tuple] = {}  # arm -> (row tensors per output leaf, their refs)
        self.sent = {"ref": False, "cand": False, "comp": False}  # the arm's process has this window's sets
        # probing (_probe): each side's intermediates kept in its graph (bytes a call) and its probes' seconds; the
        # intermediates the plan counted (_plan)
        self.held: dict[str, int] = {"ref": 0, "cand": 0}
        self.probe_s: dict[str, float] = {}
        self.held_planned = 0
        self.spares: list[int] = []  # spares still starting when the rounds began and ended (judge.spares_starting)

    # ---- the window -------------------------------------------------------------------------------------------------
    def go(self) -> bool:
        """Time the candidate; True when it is to be timed again alone (side-by-side window, device busy after it).
        Planned, the window's rounds (_rounds), then the checks after it: each refuses a speed with its reason in the
        facts, and only a candidate that passes them all has its speed reported."""
        run, f, tc = self.run, self.f, self.cfg.timing
        backend = self.j.backend
        with stage(f, "timing_compile_baseline"):
            compiled = "compile" in tc.baselines and self._compiled()
        self.arms = ["ref", "cand"] + (["comp"] if compiled else [])
        self.j.settle()
        with stage(f, "timing_plan"):
            floor = self.floor = self._floor()
            continued = self._continued()
            try:
                self.calls = self._plan()
            except ProbesOverran as e:  # the candidate's own doing: its verdict, not the job's error
                f.timing_error = str(e)
                return False
        with stage(f, "timing_allocate"):
            self._allocate()
        self.spares = [self.j.spares_starting()]
        cpu = self.j.device.type == "cpu"
        gate = QuietGate(run.cand.pid, self.j.device, backend.synchronize) if not cpu else None
        held = CpuGate(run.cand.pid) if cpu else None
        try:
            if not self._rounds(gate, held):
                return False
        except (WorkerTimeout, WorkerDied):
            raise
        except BaseException as e:
            f.timing_error = str(e)[-2000:]
            return False
        finally:
            (gate or held).resume()
        self.spares.append(self.j.spares_starting())
        if self._stopped_meanwhile(continued):
            return False
        if gate is not None and self._busy_after_blocks(gate) and not self.alone:
            # its work or the neighbours'? Asked after the window, its leftovers would have drained: timed again
            # alone instead (judge.go)
            return True
        if gate is not None and self._left_running(gate):
            return False
        if self._cpu_used_after_blocks(held) or self._faster_than_probed(None if gate is None else gate.waits):
            return False
        self._report(floor, None if gate is None else gate.waits)
        return False

    def _floor(self) -> float:
        """The protocol's floor (judge `Run.floor`), measured with the candidate's process stopped: no thread of it can
        run beside the reference's empty blocks and lengthen them, which would lengthen what is taken off every block
        and flatter a faster arm (a stop also takes nothing from an honest candidate: it is between its calls)."""
        pid = self.run.cand.pid
        try:
            # not stopped in time (gone, or a thread in a driver call): no floor this window, the judge's clock as is
            return self.run.floor() if stop_and_wait(pid) else 0.0
        finally:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:  # it died: its next command says so
                pass

    def _rounds(self, gate: QuietGate | None, held: CpuGate | None) -> bool:
        """The window's rounds until the stop rule (_enough) ends them: each round fresh inputs, one block of each arm
        in a secret order, every call's output checked, then (after the warm-up rounds) its times recorded. False: a
        timed call's output was wrong (f.spot_check says which), or the candidate's process had a process of its own
        running after the round (f.processes_spawned: one that ended before the count after the window was never
        seen, exploit `cpu/exploit_74`)."""
        f = self.f
        t_begin, rounds = time.perf_counter(), 0
        while True:
            with stage(f, "timing_fill"):
                self._fill()
            order = list(self.arms)
            self.rng.shuffle(order)  # a secret arm order: nothing can time itself against a fixed sequence
            got = {}
            with stage(f, "timing_blocks"):
                for arm in order:
                    if arm in self.arms:
                        got[arm] = self._block(arm, gate, held)
            with stage(f, "timing_check"):
                problem = self._check_rows(rounds)
            if problem:
                f.spot_check = problem
                return False
            spawned = descendants(self.run.cand.pid)
            if spawned:  # started while timed (the trials' count saw none): it ran beside the reference
                f.processes_spawned = len(spawned)
                return False
            if rounds >= self.cfg.timing.warmup:
                self._record(got)
            rounds += 1
            if self._enough(gate, t_begin):
                return True

    def _record(self, got: dict[str, Block]):
        """A counted round's times: each arm's block on the judge's clock, the preparation and read-back of each side's
        block, and each side's block as its own process measured it."""
        for arm in self.arms:
            self.clock[arm].append(got[arm].ms)
        for arm in ("ref", "cand"):
            self.outside[arm].append(got[arm].prepare_ms + got[arm].readback_ms)
            self.own[arm].append(got[arm].reply.self_ms)

    @property
    def ms(self) -> dict[str, list[float]]:
        """Each arm's counted rounds per call: its blocks less the protocol's floor (net_block_ms), over the calls."""
        return {arm: [net_block_ms(b, self.floor) / self.calls for b in blocks] for arm, blocks in self.clock.items()}

    def _enough(self, gate: QuietGate | None, t_begin: float) -> bool:
        """The stop rule, after each round: `max_reps` counted rounds, or the quiet gate's waits already refuse the
        candidate with the budget spent (_convicted); else, from `min_reps` on, every arm's times within
        `rse_target`, or the window's budget spent."""
        tc, n = self.cfg.timing, len(self.ms["cand"])
        if n >= tc.max_reps or (gate is not None and _convicted(gate.waits, time.perf_counter() - t_begin,
                                                                tc.budget_s)):
            return True
        return n >= tc.min_reps and (max(rse(s) for s in self.ms.values() if s) < tc.rse_target
                                     or time.perf_counter() - t_begin > tc.budget_s)

    # ---- after the window -----------------------------------------------------------------------------------------
    def _stopped_meanwhile(self, continued: int) -> bool:
        """The reference's or the judge's process was stopped and continued while the window ran (`continued`: their
        count of SIGCONTs before it): a refusal."""
        if self._continued() == continued:
            return False
        self.f.busy_after_return = ("the reference's or the judge's process was stopped and continued while timed "
                                    "(a signal from another process): no speed can be measured")
        return True

    @staticmethod
    def _busy_after_blocks(gate: QuietGate) -> bool:
        """The device stayed busy after the candidate's blocks (median quiet wait over LEFT_RUNNING_MS): whose work
        was it?"""
        waits = gate.waits["cand"]
        return bool(waits) and statistics.median(waits) > LEFT_RUNNING_MS

    def _left_running(self, gate: QuietGate) -> bool:
        """The quiet gate's rule (timing.left_running): the candidate left work running after its blocks, a refusal.
        Timed alone, a device busy after its blocks is asked again with its process gone."""
        waits, quiet_after_kill = gate.waits, None
        if self._busy_after_blocks(gate):  # alone here: go returned for a side-by-side window
            self.run.close_candidate()
            quiet_after_kill = gate.quiet_now()
        self.f.busy_after_return = left_running(waits["cand"], waits["ref"], quiet_after_kill)
        return bool(self.f.busy_after_return)

    def _cpu_used_after_blocks(self, held: CpuGate | None) -> bool:
        """cpu: the candidate's process computed after its timed blocks had returned (work left running in the
        background; quiet.CpuGate), a refusal."""
        problem = "" if held is None else held.busy()
        if problem:
            self.f.busy_after_return = problem
        return bool(problem)

    def _faster_than_probed(self, waits) -> bool:
        """The candidate's own slow probe capped the blocks and its timed calls then ran far faster (timing.
        faster_than_probed), a refusal; with the quiet gate's waits after each side's blocks, which say whether its
        work ran on after them (the gate did not refuse it: they were under its threshold, or the reference's too)."""
        problem = faster_than_probed(self.capped, self.probed_cand, statistics.median(self.ms["cand"]))
        if problem:
            if waits and waits["cand"] and waits["ref"]:
                problem += (f" (the device became quiet {statistics.median(waits['cand']):.3g} ms after its blocks, "
                            f"{statistics.median(waits['ref']):.3g} ms after the reference's, medians)")
            self.f.timing_error = problem
        return bool(problem)

    def _report(self, floor: float, waits):
        f, ms, n = self.f, self.ms, self.calls
        included = moved_out(self.outside["cand"], self.outside["ref"])
        ref, cand = ms["ref"], ms["cand"]
        if included:  # work moved out of the timed stretch is paid for: the time outside it counts on both sides
            ref = [a + b / n for a, b in zip(ref, self.outside["ref"])]
            cand = [a + b / n for a, b in zip(cand, self.outside["cand"])]
        sp, lo, hi = paired_speedup(ref, cand, self.rng)
        cms = statistics.median(cand)
        comp = ms["comp"]
        f.timing = Timing(method="judge", graphs=self.graph, candidate_ms=cms, reference_ms=statistics.median(ref),
                          speedup=sp, speedup_low=lo, speedup_high=hi, rse=rse(cand), reps=len(cand), calls=n,
                          floor_ms=floor, threads=self.j.threads,
                          reference_self_ms=statistics.median(self.own["ref"]) / n,
                          round_trip_ms=[round(statistics.median(self._round_trips(a)), 4) for a in ("cand", "ref")],
                          spares_starting=self.spares,
                          outside_ms=[round(statistics.median(self.outside[a]), 4) for a in ("cand", "ref")],
                          outside_included=included,
                          quiet_wait_ms=None if not waits else [round(statistics.median(waits[a]), 4)
                                                                for a in ("cand", "ref")],
                          probe_s=[round(self.probe_s[a], 3) for a in ("cand", "ref")], held_bytes=self.held_planned,
                          compile_ms=statistics.median(comp) if comp else None,
                          compile_speedup=statistics.median(comp) / cms if comp else None)

    def _round_trips(self, arm: str) -> list[float]:
        """Per block: the judge's clock less the side's own, what the protocol added to it (the candidate's own clock
        is its claim: a diagnostic, never a figure)."""
        own = [x if math.isfinite(x) else 0.0 for x in self.own[arm]]
        return [ms - x for ms, x in zip(self.clock[arm], own)]

    # ---- one block ------------------------------------------------------------------------------------------------
    def _block(self, arm: str, gate: QuietGate | None, held: CpuGate | None) -> Block | None:
        """One block of `arm` after a flushed cache on a synchronised device (None: a compile baseline that could
        not be captured, left out)."""
        run, backend = self.run, self.j.backend
        if self.cfg.timing.l2_flush:
            backend.flush_cache()
        backend.synchronize()
        side = "cand" if arm == "cand" else "ref"
        rows = self.rows.get(arm)
        cmd = SubjectCommand(op="block", shape_key="compiled" if arm == "comp" else run.base.key,
                             sets=None if self.sent[arm] else self.refs[side], graph=self.graph,
                             outputs=None if rows is None else rows[1])
        self.sent[arm] = True
        if arm == "cand":
            (gate or held).resume()
            subject, on_build = run.cand, run.j._serve_builds(run.builds)
        else:
            subject, on_build = run.j._reference(), None
        left = run.left()
        limit = block_limit_s(self.calls, self.probed_cand) if arm == "cand" else None
        grace = _Contention(run.cand.pid, limit) if limit is not None and self.j.device.type == "cpu" else None
        try:
            got = subject.block(cmd, left, on_build, spin=self.j.device.type != "cpu", limit_s=limit, grace=grace)
        except WorkerTimeout:
            if limit is None or limit >= left:  # the run's own limit ended it: a timeout
                raise
            planned = self.calls * self.probed_cand
            raise RuntimeError(f"a timed block of its {self.calls} calls ran past {limit:.3g} s, over "
                               f"{BLOCK_OVERRUN:.0f}x what its probed calls planned ({planned:.3g} ms): work queued "
                               "after its calls returned, or a slowness its probes did not show; no speed is "
                               "measured") from None
        r = got.reply
        if self.graph and cmd.sets is not None and not r.graphed:
            if arm != "comp":
                raise RuntimeError(f"the {arm} arm could not be captured as a CUDA graph this time"
                                   + (f" ({r.graph_error[:300]})" if r.graph_error else ""))
            self.arms.remove("comp")  # a compile baseline that cannot be replayed is left out, not timed otherwise
            return None
        if arm == "cand":
            run.note(r)
            (gate or held).stop()  # from its reply to its next block nothing of the candidate's process runs
        if not r.ok:
            raise RuntimeError(r.error)
        if r.misfit >= 0:
            raise RuntimeError(f"timed call {r.misfit} returned {_describe(r)}, unlike the correctness trials")
        if gate is not None and arm != "comp":  # the next block starts on a quiet device
            gate.wait(side)
        return got

    # ---- planning and buffers -------------------------------------------------------------------------------------
    def _compiled(self) -> bool:
        run, b = self.run, self.run.base
        r = run.rcall(SubjectCommand(op="build_model", shape_key="compiled", weight_seed=run.weight_seed,
                                     precision=self.cfg.precision, compiled=True))
        return r.ok and run.rcall(SubjectCommand(op="run", shape_key="compiled", inputs=b.ref_in_refs)).ok

    def _continued(self) -> int:
        """SIGCONTs the reference's and the judge's processes received: they are never stopped on purpose."""
        return self.run.rcall(SubjectCommand(op="ping")).continued + self.j.continued()

    def _plan(self) -> int:
        """Whether the window replays CUDA graphs (both sides must capture; timing.graphs), and the calls a block
        (timing.plan_calls), from probe blocks of 1 and 8 calls on the base trial's inputs, three of each: the
        difference of their medians is 7 calls without the round trip. Both arms are probed and the faster sizes the
        block, so it too lasts `block_ms`. A probe lost in noise is bounded below by a 64th of the arm's fastest
        correctness-trial call (forward, output copy, synchronisation and the round trip)."""
        b, tc = self.run.base, self.cfg.timing
        self.graph = tc.graphs and self.j.device.type == "cuda"
        per_call = self._probe()
        if per_call is None:  # a side could not be captured: eager calls on both
            self.graph = False
            per_call = self._probe()
        set_bytes, out_bytes = tensor_bytes(b.cand_in), tensor_bytes(b.ref_out)
        self.held_planned = held = held_in_plan(self.held["ref"], self.held["cand"], out_bytes)
        backend = self.j.backend
        plan = functools.partial(plan_calls, min(per_call), set_bytes, out_bytes, backend.cache_bytes(), tc.block_ms,
                                 tc.block_mem_gb * 2**30, backend.free_bytes(), held_bytes=held)
        calls = plan(max(per_call), tc.block_max_ms)
        # the candidate's own slow probe capped the blocks: its timed calls must not then run far faster (go)
        self.probed_cand, self.capped = per_call[1], per_call[1] >= per_call[0] and calls < plan()
        return calls

    def _probe(self) -> list[float] | None:
        """Each side's time a call, probed; None when a side could not be captured as a graph. A side is probed with
        8 calls only where a block of 8 would not be capped anyway (timing.probe_eight): else its one call is its
        time. The candidate's probes together may last what its timed blocks may (timing.block_limit_s) for their
        calls at its fastest correctness-trial call: work it queues behind calls that return at once (exploit_46) is
        cut there, not waited out."""
        run, b = self.run, self.run.base
        per_call, self.held, self.probe_s = [], {"ref": 0, "cand": 0}, {}
        set_bytes, out_bytes = tensor_bytes(b.cand_in), tensor_bytes(b.ref_out)
        for side in ("ref", "cand"):
            subject = run.cand if side == "cand" else self.j._reference()
            inputs = b.cand_in_refs if side == "cand" else b.ref_in_refs
            times: dict[int, list[float]] = {1: [], 8: []}
            bound = block_limit_s(sum(PROBES), run.trial_call_ms["cand"]) if side == "cand" else math.inf
            t_begin = time.perf_counter()
            for n in PROBES:
                held = held_in_plan(self.held["ref"], self.held["cand"], out_bytes)
                if n == 8 and not probe_eight(statistics.median(times[1]), call_bytes(set_bytes, out_bytes, held),
                                              self.cfg.timing.block_max_ms, self.cfg.timing.block_mem_gb * 2**30):
                    break
                fresh = not times[n]  # the sets (and a capture) with the first block of each size
                cmd = SubjectCommand(op="block", shape_key=b.key, sets=[inputs] * n if fresh else None,
                                     graph=self.graph)
                limit = bound - (time.perf_counter() - t_begin)
                try:
                    got = subject.block(cmd, run.left(), run.j._serve_builds(run.builds) if side == "cand" else None,
                                        spin=self.j.device.type != "cpu", limit_s=None if limit == math.inf else limit)
                except WorkerTimeout:
                    if limit >= run.left():  # the run's own limit ended it: a timeout
                        raise
                    raise ProbesOverran(
                        f"its probe blocks ran past {bound:.3g} s, over {BLOCK_OVERRUN:.0f}x what its correctness "
                        f"trials' calls took ({run.trial_call_ms['cand']:.3g} ms a call): work queued after its calls "
                        "returned; no speed is measured") from None
                r = got.reply
                if side == "cand":
                    run.note(r)
                if not r.ok:
                    raise RuntimeError(r.error)
                if self.graph and not r.graphed:
                    return None
                self.held[side] = max(self.held[side], r.held_bytes)
                times[n].append(got.ms)
            self.probe_s[side] = time.perf_counter() - t_begin
            if not times[8]:
                per_call.append(statistics.median(times[1]))
                continue
            probe = (statistics.median(times[8]) - statistics.median(times[1])) / 7
            per_call.append(max(probe, run.trial_call_ms[side] / 64, 1e-4))
        return per_call

    def _allocate(self):
        """The window's input sets, twice (the candidate's copy in its own directory or memory pool, read-only to it
        where the platform allows; the reference's in the judge's), and the read-back rows: one [calls, ...] buffer per
        output tensor for each arm that is checked. A block of one call (large tensors) uses the base trial's buffers:
        a window then costs the judge no memory beyond the trials'."""
        run, b = self.run, self.run.base
        if self.calls == 1:
            self.sets = {"cand": [b.cand_in], "ref": [b.ref_in]}
            self.refs = {"cand": [b.cand_in_refs], "ref": [b.ref_in_refs]}
            for arm, outs, refs in (("cand", b.cand_out, b.cand_out_refs), ("ref", b.ref_out, b.ref_out_refs)):
                views = [None if t is None else buffers.prefix_view(t, ref, [1, *t.shape], t.dtype)
                         for t, ref in zip(outs, refs)]
                self.rows[arm] = ([v and v[0] for v in views], [v and v[1] for v in views])
            return
        for _ in range(self.calls):
            for side in ("cand", "ref"):
                tensors, refs = run.share(b.layout, side)
                self.sets[side].append(tensors)
                self.refs[side].append(refs)
        for arm in ("cand", "ref"):
            rows, refs = [], []
            for leaf in b.spec.leaves:
                if not leaf["tensor"]:
                    rows.append(None)
                    refs.append(None)
                    continue
                t, ref = run.alloc_buffer([self.calls, *leaf["shape"]], buffers.DTYPE_NAMES[leaf["dtype"]],
                                          candidate=arm == "cand")
                rows.append(t)
                refs.append(ref)
            self.rows[arm] = (rows, refs)

    def _fill(self):
        """Fresh values in every input set (a new secret seed each), written into the reference's copy, which no
        candidate can map, then copied into the candidate's; the candidate's rows poisoned, so a call whose output is
        not read back leaves values no reference has."""
        run = self.run
        for k in range(self.calls):
            seed = self.rng.randrange(1, 2**31)
            raw = raw_inputs(run.task, Shape(), seed, self.j.device)
            fill_inputs(self.sets["ref"][k], raw, seed, self.j.device, self.cfg.precision)
            del raw
            for c, r in zip(self.sets["cand"][k], self.sets["ref"][k]):
                if isinstance(c, torch.Tensor):
                    c.copy_(r)
        for t in self.rows["cand"][0]:
            if t is not None:
                buffers.poison(t, self.rng.randrange(1, 2**31))
        self.j.backend.synchronize()

    def _check_rows(self, round_: int) -> str:
        """Every call's output row against the reference's, at the same secret positions of each row; one whole row
        too, drawn in secret. A reason when a call's output is wrong."""
        tol = self.cfg.tolerance()
        rng = random.Random(self.rng.randrange(1, 2**63))
        whole = rng.randrange(self.calls)
        for leaf, (c, r) in enumerate(zip(self.rows["cand"][0], self.rows["ref"][0])):
            if c is None:
                continue
            cv, rv = c.reshape(self.calls, -1), r.reshape(self.calls, -1)
            n = cv.shape[1]
            if n > max(1, SPOT_POSITIONS // self.calls):
                gen = torch.Generator(device=c.device).manual_seed(rng.randrange(1, 2**31))
                idx = torch.randint(0, n, (max(1, SPOT_POSITIONS // self.calls),), device=c.device, generator=gen)
                cv, rv = cv[:, idx], rv[:, idx]
            if not compare(cv, rv, tol).ok:  # all rows at once; the failing call named only on failure
                for k in range(self.calls):
                    res = compare(cv[k], rv[k], tol)
                    if not res.ok:
                        return f"timed call {k} of round {round_}: {_leaf(leaf)}{res.reason}"
            res = compare(c[whole], r[whole], tol)
            if not res.ok:
                return f"timed call {whole} of round {round_}: {_leaf(leaf)}{res.reason}"
        return ""


class _Contention:
    """`grace()` for a candidate's cpu block (judge.Subject.block): its limit again, at most CONTENDED_GRACES times,
    when other processes kept the machine busy while it ran (timing.contended)."""

    def __init__(self, pid: int, limit_s: float):
        self.pid, self.limit_s, self.left = pid, limit_s, CONTENDED_GRACES
        self.t0, self.busy0, self.own0 = time.monotonic(), _busy_s(), cpu_seconds(pid)

    def __call__(self) -> float:
        if self.left <= 0:
            return 0.0
        wall, busy, own = time.monotonic() - self.t0, _busy_s() - self.busy0, cpu_seconds(self.pid) - self.own0
        if not contended(busy, own, wall):
            return 0.0
        self.left -= 1
        return self.limit_s


def _busy_s() -> float:
    """CPU seconds the whole machine has spent busy (all cores)."""
    import psutil

    t = psutil.cpu_times()  # guest time is inside user (Linux): not added again
    return sum(getattr(t, k, 0.0) for k in ("user", "nice", "system", "irq", "softirq", "steal"))


def _leaf(i: int) -> str:
    return f"output {i}: " if i else ""


def _describe(r: SubjectReply) -> str:
    leaves = r.spec.leaves if r.spec else []
    return ", ".join(f"{x.get('type')} {x.get('shape')} {x.get('dtype')}" if x.get("tensor") else repr(x.get("value"))
                     for x in leaves) or "nothing"


