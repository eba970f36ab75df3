"""Host-memory KV tier: offload on expiry, reload on the next call at the host link's bandwidth."""
from __future__ import annotations

from simcore.kv import KVManager
from simcore.sim import simulate

from tests.helpers import small_cell


def test_offload_moves_run_to_host_and_it_is_hittable_there():
    kv = KVManager(num_blocks=9, block_size=16, host_blocks=16)   # 8 usable: one is the null block
    kv.allocate(4)
    kv.release(pid=7, full_blocks=4, total_blocks=4, now=0.0, kind="protect", until=1.0, then="offload")
    assert kv.residency(7).tier == "device" and kv.num_protected == 4
    kv.expire(2.0)
    assert kv.residency(7) == (0, None, "host") and kv.cached_blocks(7) == 0 and kv.num_free == 8
    dev, host = kv.lookup(7, shared_tokens=10_000, num_tokens=100)
    assert (dev, host) == (0, 4)          # all 4 offloaded blocks; the cap (99 // 16 = 6) is not binding
    kv.audit(held_by_requests=0)


def test_host_lru_evicts_oldest_run_when_full():
    kv = KVManager(num_blocks=9, block_size=16, host_blocks=5)
    for pid in (1, 2):
        kv.allocate(3)
        kv.release(pid=pid, full_blocks=3, total_blocks=3, now=float(pid), kind="offload")
    assert 1 not in kv.host and kv.host[2] == 3
    kv.audit(held_by_requests=0)


def test_offload_ttl_reloads_instead_of_recomputing():
    ttl = simulate("rtx70b_swe_0.1", retention="ttl", scheduling="plas").summary
    off = simulate("rtx70b_swe_0.1", retention="offload-ttl", scheduling="plas")
    assert (off.calls["host_hit_tokens"] > 0).any()
    assert off.summary["prefill_tokens_computed"] < ttl["prefill_tokens_computed"]


def test_without_host_memory_offload_ttl_degrades_to_dropping():
    cell = small_cell("rtx70b_swe10_0.1")
    cell = cell.model_copy(update={"hardware": cell.hardware.model_copy(update={"host_kv_gib": 0})})
    res = simulate(cell, retention="offload-ttl")
    assert res.summary["calls"] > 0 and (res.calls["host_hit_tokens"] == 0).all()


def test_reload_is_charged_at_host_bandwidth():
    cell = small_cell("rtx70b_swe_0.1")
    slow = cell.model_copy(update={"hardware": cell.hardware.model_copy(update={"host_link_gbs": 0.5})})
    fast = simulate(cell, retention="offload-ttl", scheduling="plas").summary["mean_jct_s"]
    slow_jct = simulate(slow, retention="offload-ttl", scheduling="plas").summary["mean_jct_s"]
    assert slow_jct > fast
