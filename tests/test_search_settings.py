"""Search settings: the paper's defaults, config-file and flag overrides, one-line errors."""
import time

import pytest

from search.determinism import CountingUUID, OrderedExecutor
from search.settings import SettingsError, load_settings


def test_defaults_are_the_papers_search_settings():
    s = load_settings()
    assert (s.iterations, s.population, s.islands, s.migration_interval) == (50, 40, 2, 10)
    assert (s.elite_ratio, s.exploration, s.exploitation) == (0.2, 0.3, 0.6)
    assert s.diff_based and (s.num_top_programs, s.num_diverse_programs) == (3, 2)
    assert s.llm.models == [] and s.llm.temperature == 1.0


def test_config_file_then_flags_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("iterations: 7\nislands: 3\nevaluator:\n  workload_seeds: [0, 1, 2]\n")
    s = load_settings(str(f), {"islands": 4, "seed": None})
    assert (s.iterations, s.islands, s.seed) == (7, 4, 42)
    assert s.evaluator.workload_seeds == [0, 1, 2] and s.evaluator.stage1_cell == "auto"


@pytest.mark.parametrize("text,needle", [
    ("iterations: [1\n", "not valid YAML"),
    ("iteratons: 5\n", "iteratons"),
    ("exploration: 0.8\nexploitation: 0.6\n", "exploration + exploitation"),
    ("llm:\n  models:\n    - {weight: 1}\n", "llm.models.0.backend"),
])
def test_bad_config_is_one_line_naming_file_and_field(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SettingsError) as e:
        load_settings(str(f))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and (str(f) in msg or "configs/search.yaml" in msg)


def test_ordered_executor_releases_results_in_submission_order():
    ex = OrderedExecutor(3)
    order = []
    futs = [ex.submit(time.sleep, d) for d in (0.3, 0.05, 0.1)]
    for i, f in enumerate(futs):
        f.add_done_callback(lambda _f, i=i: order.append(i))
    for f in futs:
        f.result(timeout=5)
    assert order == [0, 1, 2]
    ex.shutdown()


def test_counting_uuid_is_deterministic_and_unique():
    a, b = CountingUUID(3), CountingUUID(3)
    ids = [a.uuid4() for _ in range(50)]
    assert ids == [b.uuid4() for _ in range(50)] and len(set(ids)) == 50
    assert CountingUUID(4).uuid4() != ids[0]
