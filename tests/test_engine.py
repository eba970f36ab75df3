"""Engine correctness: tests that fail on a wrong engine (issue 2, "Must show")."""
from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simcore.config import EngineArgs, get_cell
from simcore.instance import Instance
from simcore.kv import KVManager
from simcore.request import Request
from simcore.sim import Simulation, simulate
from simcore.workload import Call, Program, poisson_arrivals

from tests.helpers import ConstantPerf, chain_programs, small_cell


def test_release_rule_eq2_holds_for_every_call():
    res = simulate("rtx70b_swe10_0.1", retention="ttl", scheduling="plas")
    from simcore.sim import cell_programs
    from simcore.config import get_cell
    progs = {p.program_id: p for p in cell_programs(get_cell("rtx70b_swe10_0.1"), 0)}
    calls = res.calls.sort_values(["program_id", "turn"])
    arrivals = dict(zip(res.programs["program_id"], res.programs["arrival_s"]))
    checked = 0
    for pid, g in calls.groupby("program_id"):
        rel, fin = g["release_s"].to_numpy(), g["finish_s"].to_numpy()
        assert rel[0] == arrivals[pid]                       # r_{p,1} = a_p
        for k in range(1, len(g)):
            gap = progs[pid].calls[k - 1].tool_duration_s
            assert rel[k] == fin[k - 1] + gap                # r_{p,k+1} = c_{p,k} + g_{p,k}
            checked += 1
    assert checked == len(calls) - len(arrivals) > 0


def _run(cell, programs, arrivals, retention="cache-lru", scheduling="fcfs", routing="round-robin", audit=False):
    from simcore.policies.registry import load_policy

    class Audit:
        """Checks the block accounting after every step."""

        def on_step(self, inst, *args):
            inst.kv.audit(sum(r.held for r in inst.running))

        def on_finish(self, inst, req, now):
            pass

    sim = Simulation(cell, programs, arrivals, load_policy("retention", retention),
                     load_policy("scheduling", scheduling), load_policy("routing", routing),
                     observers=(Audit(),) if audit else ())
    sim.run()
    return sim


def test_every_program_completes_and_output_tokens_are_conserved():
    from simcore.sim import cell_programs
    cell = small_cell("rtx70b_swe10_0.1")
    progs = cell_programs(cell, 3)
    sim = _run(cell, progs, poisson_arrivals(len(progs), cell.rate_jps, 3), "ttl", "plas", audit=True)
    assert all(p.finished_s is not None for p in sim.orch.pcbs)
    assert len(sim.metrics.finished) == sum(len(p.calls) for p in progs)
    for req in sim.metrics.finished:
        assert req.generated == req.output == progs[req.pid].calls[req.turn].output_tokens
        assert req.finished is not None and req.first_token is not None
        assert req.arrival <= req.first_sched <= req.first_token <= req.finished


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(progs=chain_programs(), retention=st.sampled_from(["cache-lru", "ttl", "evict-always", "offload-ttl", "min-waste"]),
       scheduling=st.sampled_from(["fcfs", "plas", "program-fcfs"]), rate=st.floats(0.5, 20.0))
def test_kv_in_use_never_exceeds_pool_and_accounting_is_exact(progs, retention, scheduling, rate):
    # A pool barely larger than the biggest call: forces preemption and reclamation.
    biggest = max(c.prompt_tokens + c.output_tokens for p in progs for c in p.calls)
    cell = small_cell("rtx70b_swe10_0.1", kv_pool_tokens=biggest + 64, max_num_batched_tokens=256, max_num_seqs=4)
    sim = _run(cell, progs, poisson_arrivals(len(progs), rate, 1), retention, scheduling, audit=True)
    assert all(p.finished_s is not None for p in sim.orch.pcbs)
    for req in sim.metrics.finished:
        assert req.generated == req.output


def test_same_seed_gives_identical_results_and_other_seed_differs():
    a = simulate("rtx70b_swe10_0.1", retention="ttl", scheduling="plas", seed=5)
    b = simulate("rtx70b_swe10_0.1", retention="ttl", scheduling="plas", seed=5)
    c = simulate("rtx70b_swe10_0.1", retention="ttl", scheduling="plas", seed=6)
    pd.testing.assert_frame_equal(a.programs, b.programs)
    pd.testing.assert_frame_equal(a.calls, b.calls)
    assert a.summary["mean_jct_s"] != c.summary["mean_jct_s"]


def test_eviction_follows_eq5_order():
    kv = KVManager(num_blocks=13, block_size=16)
    kv.allocate(12)                          # every usable block held by running requests
    kv.release(pid=1, full_blocks=3, total_blocks=3, now=1.0, kind="release")            # LRU value 1.0
    kv.release(pid=2, full_blocks=2, total_blocks=2, now=2.0, kind="protect", until=50.0, value=9.0)
    kv.release(pid=3, full_blocks=2, total_blocks=2, now=3.0, kind="release")            # LRU value 3.0
    kv.release(pid=4, full_blocks=2, total_blocks=2, now=4.0, kind="protect", until=10.0, value=1.0)
    kv.release(pid=5, full_blocks=3, total_blocks=3, now=5.0, kind="protect", until=60.0, value=4.0)
    kv.audit(held_by_requests=0)
    # Unprotected first, lowest value (oldest access) first, eaten from the tail.
    kv.allocate(4)
    assert (kv.cached_blocks(1), kv.cached_blocks(3)) == (0, 1)
    # Expired entries rejoin the unprotected set at their value: pid 4 (value 1) precedes pid 3 (3.0).
    kv.expire(20.0)
    kv.allocate(2)
    assert (kv.cached_blocks(4), kv.cached_blocks(3)) == (0, 1)
    # All remaining cached KV but pid 3's is protected: pid 3 goes, then the least-valued protected (pid 5, 4.0 < 9.0).
    kv.allocate(3)
    assert (kv.cached_blocks(3), kv.cached_blocks(5), kv.cached_blocks(2)) == (0, 1, 2)
    kv.audit(held_by_requests=12 - 3)


def _req(rid, prio, arrival, prompt=31, output=200):
    return Request(rid=rid, pid=rid, turn=0, prompt=prompt, output=output, shared=0,
                   priority=prio, arrival=arrival, instance=0)


def _instance(num_blocks: int, mode: str = "fcfs", **engine) -> Instance:
    args = EngineArgs(scheduling_policy=mode, **{"max_num_seqs": 8, "max_num_batched_tokens": 64, **engine})
    return Instance(0, KVManager(num_blocks=num_blocks, block_size=16), ConstantPerf(1.0), args)


def _steps(inst: Instance, now: float, n: int = 1) -> float:
    """n single steps; finished calls give their blocks back as cache-LRU retention does."""
    for _ in range(n):
        now = inst.step(now, now)              # horizon = now: one step at a time
        for req in inst.finish_step(now):
            inst.kv.release(req.pid, req.num_computed // inst.block_size, req.held, now)
            req.held = 0
    return now


@pytest.mark.parametrize("mode,expected_victim", [("priority", 0), ("fcfs", 2)])
def test_preemption_picks_the_vllm_victim(mode, expected_victim):
    # vllm/v1/core/sched/scheduler.py, Scheduler.schedule: priority policy -> the running
    # request with the largest (priority, arrival); FCFS -> the last one.
    inst = _instance(8, mode, max_num_batched_tokens=4096)      # 7 usable blocks
    b, a, c = _req(0, 5, 0.0), _req(1, 1, 0.005), _req(2, 3, 0.006)
    inst.add(b)
    now = _steps(inst, 0.0)                    # b admitted alone: 31 tokens, 2 blocks
    inst.add(a)
    inst.add(c)
    now = _steps(inst, now)                    # a, c admitted: 6 of 7 blocks held
    for _ in range(40):
        now = _steps(inst, now)
        inst.kv.audit(sum(r.held for r in inst.running))
        victims = [r for r in (b, a, c) if r.preemptions]
        if victims:
            break
    assert [r.rid for r in victims] == [expected_victim]
    # The victim restarts from scratch, back in the waiting queue.
    assert victims[0].num_computed == 0 and victims[0] not in inst.running and inst.num_waiting == 1


# ---------------------------------------------------------------- the three vLLM 0.32 rules
def test_null_block_is_reserved():
    # vllm/v1/core/block_pool.py, BlockPool.__init__ (null_block = free_block_queue.popleft())
    # and BlockPool.get_usage (1 - free / (num_gpu_blocks - 1)): of 10 blocks, 9 are usable.
    kv = KVManager(num_blocks=10, block_size=16)
    assert kv.num_usable == 9 and kv.available() == 9 and kv.usage() == 0.0
    kv.allocate(3)
    assert kv.usage() == pytest.approx(3 / 9)
    kv.allocate(6)
    assert kv.usage() == 1.0 and not kv.can_allocate(1)
    # The simulator sizes the pool like vLLM: rtx70b's 114,768 tokens are 7,173 blocks, 7,172 usable.
    from simcore.policies.registry import load_policy
    sim = Simulation(get_cell("rtx70b_swe10_0.1"), [Program("p", (Call(10, 2),))], [0.0],
                     *(load_policy(a, n) for a, n in (("retention", "cache-lru"), ("scheduling", "fcfs"),
                                                     ("routing", "round-robin"))))
    assert (sim.instances[0].kv.num_blocks, sim.instances[0].kv.num_usable) == (7173, 7172)


def test_blocks_without_a_hash_are_reused_first():
    # vllm/v1/core/block_pool.py, BlockPool.free_blocks: blocks with a prefix hash are appended
    # to the free queue (LRU), blocks without one are prepended (reused first).
    kv = KVManager(num_blocks=6, block_size=16)                 # 5 usable
    kv.allocate(3)                                               # program 1's request
    kv.allocate(2)                                               # program 2's request
    kv.release(pid=1, full_blocks=3, total_blocks=3, now=1.0)   # 3 hashed blocks, freed first
    kv.release(pid=2, full_blocks=0, total_blocks=2, now=2.0)   # 2 partial blocks, freed later
    assert kv.free_queue() == [(-1, 2, 0), (1, 2, 0)]            # head: 2 blank; then program 1's blocks 2, 1, 0
    kv.allocate(2)                                               # the later-freed blank blocks go first ...
    assert kv.cached_blocks(1) == 3
    kv.allocate(1)                                               # ... then program 1's run, from its tail
    assert kv.cached_blocks(1) == 2 and kv.free_queue() == [(1, 1, 0)]
    kv.audit(held_by_requests=3)


def test_admission_needs_the_whole_prompt_to_fit():
    # vllm/v1/core/sched/scheduler.py, Scheduler.schedule -> KVCacheManager.allocate_slots(
    # full_sequence_must_fit=scheduler_reserve_full_isl) in vllm/v1/core/kv_cache_manager.py.
    for full_isl, admitted in ((True, False), (False, True)):
        inst = _instance(11, scheduler_reserve_full_isl=full_isl)   # 10 usable blocks
        a = _req(0, 0, 0.0, prompt=60, output=100)
        inst.add(a)
        now = _steps(inst, 0.0)                          # a: 60 tokens, ceil(60/16) = 4 blocks
        r = _req(1, 0, now, prompt=120)
        inst.add(r)
        _steps(inst, now)                                # a decodes (61 tokens, still 4 blocks)
        # r's first chunk (the 63 tokens of budget a left) needs ceil(63/16) = 4 of the 6 free
        # blocks, its whole prompt ceil(120/16) = 8:
        assert (r in inst.running) is admitted
        assert r.num_computed == (63 if admitted else 0) and inst.kv.available() == (2 if admitted else 6)


# ---------------------------------------------------------------- consequences of the block-level rules
def test_scheduled_victim_keeps_the_hashes_of_its_chunk():
    # vllm/v1/core/kv_cache_manager.py, KVCacheManager.allocate_slots caches (hashes) the
    # blocks of the tokens it schedules before they are computed; a priority-policy victim
    # scheduled earlier in the step (Scheduler.schedule) frees them with their hashes.
    # The same case runs against vLLM in tests/parity ("scheduled-victim").
    inst = _instance(10, "priority", long_prefill_token_threshold=32, scheduler_reserve_full_isl=False)
    v, h = _req(0, 9, 0.0, prompt=140, output=5), _req(1, 0, 1.0, prompt=16, output=10)
    inst.add(v)
    now = _steps(inst, 0.0)                    # v alone: 64 tokens (no one to starve), 4 blocks
    inst.add(h)
    now = _steps(inst, now)                    # v 32 more (96: 6 blocks), h its 16 (1 block)
    now = _steps(inst, now)                    # v schedules 32 (blocks 6, 7); h needs a block: v goes
    assert v.preemptions == 1 and v not in inst.running
    assert inst.kv.free_queue() == [(0, 6, 0)]  # v's blocks 0..7 were hashed; h took the last one
    while v not in inst.running:
        now = _steps(inst, now)
    assert v.hit_tokens == 7 * 16              # 112 (96 if the chunk were lost)


def test_a_block_cached_twice_is_taken_from_the_older_copy():
    # vllm/v1/core/block_pool.py, BlockHashToBlockMap.get_one_block returns the copy inserted
    # first; BlockPool.touch takes it out of the free queue, the other copy stays put.
    kv = KVManager(num_blocks=20, block_size=16)
    kv.admit(1, 0, 0.0)
    kv.allocate(4)
    kv.release(1, full_blocks=4, total_blocks=4, now=1.0)        # run A: blocks 0..3
    # next call: its 64-token prompt is a prefix of the stream; the hit stops at (64 - 1) // 16 = 3
    assert kv.lookup(1, shared_tokens=64, num_tokens=64) == (3, 0)
    kv.admit(1, 3, 2.0)
    kv.allocate(2)                                               # block 3 again (recomputed), block 4
    assert kv.free_queue() == [(-1, 13, 0), (1, 3, 3)]           # A's block 3 stays where it was
    kv.release(1, full_blocks=5, total_blocks=5, now=3.0)        # run B: blocks 0..4 (0..2 are A's)
    assert kv.free_queue() == [(-1, 13, 0), (1, 3, 3), (1, 4, 0)]
    assert kv.lookup(1, shared_tokens=200, num_tokens=200) == (5, 0)
    kv.admit(1, 5, 4.0)
    # index 3: A's copy (cached first) leaves the queue; B's own copy of block 3 stays
    assert kv.free_queue() == [(-1, 13, 0), (1, 3, 3)]
    kv.audit(held_by_requests=5)


def test_a_diverged_stream_leaves_its_stale_blocks_in_place():
    # A call sharing only part of the stream (shared_prefix_tokens) hits the blocks before
    # the divergence; vLLM leaves the rest where they are in the free queue (they no
    # longer match anything) until they are reused.
    kv = KVManager(num_blocks=20, block_size=16)
    kv.admit(1, 0, 0.0)
    kv.allocate(6)
    kv.release(1, full_blocks=6, total_blocks=6, now=1.0)
    assert kv.lookup(1, shared_tokens=40, num_tokens=300) == (2, 0)   # 40 // 16 = 2 blocks match
    kv.admit(1, 2, 2.0)
    assert kv.free_queue() == [(-1, 13, 0), (1, 5, 2)] and kv.cached_blocks(1) == 0
    kv.audit(held_by_requests=2)


def test_no_prefix_caching_frees_every_block_blank():
    kv = KVManager(num_blocks=10, block_size=16, enable_caching=False)
    kv.admit(1, 0, 0.0)
    kv.allocate(4)
    kv.release(1, full_blocks=4, total_blocks=4, now=1.0)
    assert kv.lookup(1, 1000, 1000) == (0, 0) and kv.free_queue() == [(-1, 9, 0)]


def test_single_server_batch1_matches_md1_mean_wait(constant_perf):
    dt, out = 0.01, 50                       # service time D = out * dt (prefill step makes token 1)
    D = out * dt
    rho = 0.6
    lam = rho / D
    n = 6000
    progs = [Program(f"r{i}", (Call(64, out),)) for i in range(n)]
    cell = small_cell("rtx70b_swe10_0.1", max_num_seqs=1, rate_jps=lam)
    runs = [simulate(cell, programs=progs, seed=s) for s in range(4)]
    wq = np.concatenate([r.calls["queueing_s"].to_numpy() for r in runs])
    expected = rho * D / (2 * (1 - rho))     # Pollaczek-Khinchine, deterministic service
    # 24k correlated waits: the sampling error of the mean is ~2-3 %; an engine that adds or
    # drops a step per call, or admits past max_num_seqs, misses by far more.
    assert abs(wq.mean() - expected) / expected < 0.05, (wq.mean(), expected)
    for r in runs:
        assert np.allclose(r.calls["e2e_s"] - r.calls["queueing_s"], D)


def test_littles_law_on_a_long_run():
    # L from the engine's own queue counts (running + waiting per step) vs lambda*W from the
    # per-call release/finish records: two independent code paths must agree.
    from simcore.sim import cell_programs
    cell = small_cell("rtx70b_swe_0.1")
    progs = cell_programs(cell, 0)
    sim = _run(cell, progs, poisson_arrivals(len(progs), cell.rate_jps, 0), "ttl", "plas")
    rec = sim.metrics.instances[0]
    reqs = sim.metrics.finished
    t = np.array(rec.t + [max(r.finished for r in reqs)])
    n = np.array(rec.inflight, dtype=float)
    L_engine = float((n * np.diff(t)).sum() / (t[-1] - t[0]))
    # The engine counts a call from the first step that starts at or after its arrival (a
    # call arriving mid-step waits for that step to end), so the records are read the same way.
    seen = t[np.searchsorted(t, np.array([r.arrival for r in reqs]) - 1e-9)]
    L_calls = float((np.array([r.finished for r in reqs]) - seen).sum() / (t[-1] - t[0]))
    assert L_engine == pytest.approx(L_calls, rel=1e-3)
    # ... and the calls' own e2e differs from that only by those mid-step arrivals
    L_e2e = sum(r.finished - r.arrival for r in reqs) / (t[-1] - t[0])
    assert L_calls <= L_e2e < 1.1 * L_calls


def test_plas_beats_fcfs_at_rtx70b_swe_002():
    fcfs = simulate("rtx70b_swe_0.02", retention="cache-lru", scheduling="fcfs").summary["mean_jct_s"]
    plas = simulate("rtx70b_swe_0.02", retention="cache-lru", scheduling="plas").summary["mean_jct_s"]
    assert plas < fcfs


def test_multi_instance_routing_is_live():
    # At 0.5 JPS the four 120k-token pools are under pressure: placement decides reuse.
    rr = simulate("b200x4_8b_swe_0.5", routing="round-robin")
    aff = simulate("b200x4_8b_swe_0.5", routing="session-affinity")
    assert rr.calls["instance"].nunique() == 4 and aff.calls["instance"].nunique() == 4
    # Affinity keeps a program's calls where its prefix is cached: less recompute, lower JCT.
    assert aff.summary["prefix_hit_rate"] > rr.summary["prefix_hit_rate"]
    assert aff.summary["prefill_tokens_computed"] < rr.summary["prefill_tokens_computed"]
    assert aff.summary["mean_jct_s"] < rr.summary["mean_jct_s"]


def test_engine_knobs_are_set_per_cell_and_checked(tmp_path):
    import shutil

    from simcore.config import ConfigError, cell_catalog, _data_root
    for f in ("hardware.yaml", "models.yaml"):
        shutil.copy(_data_root() / f, tmp_path / f)
    (tmp_path / "cells.yaml").write_text(
        "defaults: {engine: {block_size: 16, max_num_seqs: 8, max_num_batched_tokens: 512}}\n"
        "families:\n"
        "  t:\n"
        "    {hardware: RTXPRO6000, model: Llama-3.1-70B, tp: 2, kv_pool_tokens: 16000,\n"
        "     workload: {kind: swe, programs: 2}, rates: [0.1, 0.2],\n"
        "     engine: {long_prefill_token_threshold: 256},\n"
        "     per_rate: {'0.2': {engine: {scheduler_reserve_full_isl: false, watermark: 0.05}}}}\n")
    cells = cell_catalog(str(tmp_path))
    a, b = cells["t_0.1"].engine, cells["t_0.2"].engine
    assert (a.long_prefill_token_threshold, a.scheduler_reserve_full_isl, a.watermark) == (256, True, 0.0)
    assert (b.long_prefill_token_threshold, b.scheduler_reserve_full_isl, b.watermark) == (256, False, 0.05)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("hardware.yaml", "models.yaml"):
        shutil.copy(tmp_path / f, bad / f)
    (bad / "cells.yaml").write_text((tmp_path / "cells.yaml").read_text().replace("watermark: 0.05", "watermark: 1.5"))
    with pytest.raises(ConfigError, match=r"cells.yaml: families.t.engine.watermark"):
        cell_catalog(str(bad))
