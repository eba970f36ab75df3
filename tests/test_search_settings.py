"""Search settings: the paper's defaults, config-file and flag overrides, one-line errors;
the --llm ensemble syntax; the OpenEvolve version range we test against."""
import pytest

from search.llm import LLMSetupError, label_for, parse_llm_flag, request_seed
from search.settings import SettingsError, load_settings


def test_defaults_are_the_papers_search_settings():
    s = load_settings()
    assert (s.iterations, s.population, s.islands, s.migration_interval) == (50, 40, 2, 10)
    assert (s.elite_ratio, s.exploration, s.exploitation) == (0.2, 0.3, 0.6)
    assert s.diff_based and (s.num_top_programs, s.num_diverse_programs) == (3, 2)
    assert s.llm.models == [] and s.llm.temperature == 1.0
    # robust fitness by default: three in-sample draws, five held-out ones, disjoint
    assert s.evaluator.workload_seeds == [0, 1, 2] and len(s.evaluator.heldout.draws) == 5
    assert not set(s.evaluator.workload_seeds) & set(s.evaluator.heldout.draws)
    assert s.llm.max_consecutive_failures == 5


def test_config_file_then_flags_override(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("iterations: 7\nislands: 3\nevaluator:\n  workload_seeds: [0, 1, 2]\n")
    s = load_settings(str(f), {"islands": 4, "seed": None})
    assert (s.iterations, s.islands, s.seed) == (7, 4, 42)
    assert s.evaluator.workload_seeds == [0, 1, 2] and s.evaluator.leak_cell == "auto"


@pytest.mark.parametrize("text,needle", [
    ("iterations: [1\n", "not valid YAML"),
    ("iteratons: 5\n", "iteratons"),
    ("exploration: 0.8\nexploitation: 0.6\n", "exploration + exploitation"),
    ("llm:\n  models:\n    - {weight: 1}\n", "llm.models.0.backend"),
    ("evaluator:\n  heldout:\n    draws: [1, 50]\n", "must not repeat in-sample"),
    ("evaluator:\n  workload_seeds: [0, 0]\n", "repeated draws"),
])
def test_bad_config_is_one_line_naming_file_and_field(tmp_path, text, needle):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(SettingsError) as e:
        load_settings(str(f))
    msg = str(e.value)
    assert needle in msg and "\n" not in msg and (str(f) in msg or "configs/search.yaml" in msg)


def test_invalid_flag_values_name_the_flag():
    with pytest.raises(SettingsError, match=r"^--iterations -1: "):
        load_settings(None, {"iterations": -1})
    with pytest.raises(SettingsError, match=r"^--workers 0: "):
        load_settings(None, {"workers": 0})


def test_llm_flag_takes_weighted_ensembles():
    e = parse_llm_flag("openai:qwen3@0.7,anthropic:claude-x@0.3", api_base="http://h/v1")
    assert [(x.backend, x.weight, x.api_base) for x in e] == [("openai:qwen3", 0.7, "http://h/v1"),
                                                             ("anthropic:claude-x", 0.3, None)]
    assert label_for(e) == "openai:qwen3@0.7 + anthropic:claude-x@0.3"
    assert [x.backend for x in parse_llm_flag("openai:qwen2.5-coder:7b")] == ["openai:qwen2.5-coder:7b"]
    for bad in ("openai:a@0", "openai:a,", "gpt4", "openai:a@-1"):
        with pytest.raises(LLMSetupError):
            parse_llm_flag(bad)


def test_request_seed_varies_per_iteration_and_is_reproducible():
    seeds = [request_seed(42, i) for i in range(1, 51)]
    assert len(set(seeds)) == 50 and seeds == [request_seed(42, i) for i in range(1, 51)]


def test_openevolve_is_in_the_pinned_range_and_has_the_public_objects_we_use():
    from importlib.metadata import version

    from packaging.version import Version
    v = Version(version("openevolve"))
    assert Version("0.4.0") <= v < Version("0.5")
    from openevolve.database import Program, ProgramDatabase
    from openevolve.prompt.sampler import PromptSampler
    for name in ("add", "get", "sample_from_island", "should_migrate", "increment_island_generation", "save",
                 "islands", "island_generations", "last_migration_generation", "programs"):
        assert hasattr(ProgramDatabase, name) or name in ProgramDatabase.__init__.__code__.co_names, name
    assert hasattr(PromptSampler, "build_prompt") and {"id", "code", "metrics", "metadata"} <= set(
        Program.__dataclass_fields__)
