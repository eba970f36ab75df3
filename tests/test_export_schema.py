"""The export's view classes are generated from simcore/pcb.py, the single definition."""
from __future__ import annotations

import dataclasses
import importlib

import pytest

from tests.export_helpers import load_exported
from tests.runs_fixture import exported_package
from search.export import schema
from search.runs import RunsError
from simcore import pcb


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    out = exported_package(tmp_path_factory, "scheduling")
    return importlib.import_module(load_exported(out).__name__ + ".runtime"), out


def _fields(cls: type) -> list[tuple[str, str, object]]:
    return [(f.name, str(f.type), f.default) for f in dataclasses.fields(cls)]


@pytest.mark.parametrize("name", ["ProgramView", "InstanceView", "Signals"])
def test_runtime_classes_are_the_simulators(runtime, name):
    rt, _ = runtime
    ours, sims = getattr(rt, name), getattr(pcb, name)
    assert _fields(ours) == _fields(sims)
    assert ours.__dataclass_params__.frozen == sims.__dataclass_params__.frozen
    assert ("__slots__" in vars(ours)) == ("__slots__" in vars(sims))


def test_runtime_fields_are_the_observable_allow_list(runtime):
    rt, _ = runtime
    assert set(rt.PROGRAM_VIEW_FIELDS) == pcb.OBSERVABLE_PCB_FIELDS
    assert {f.name for f in dataclasses.fields(rt.Signals)} == pcb.OBSERVABLE_SIGNAL_FIELDS
    assert {f.name for f in dataclasses.fields(rt.InstanceView)} == pcb.OBSERVABLE_INSTANCE_FIELDS


def test_methods_behave_as_the_simulators(runtime):
    rt, _ = runtime
    values = {f.name: None for f in dataclasses.fields(pcb.ProgramView)}
    for gap in (None, 3.0, 12.5):
        values["gap_started_s"] = gap
        for now in (0.0, 5.0, 20.0):
            assert rt.ProgramView(**values).gap_elapsed_s(now) == pcb.ProgramView(**values).gap_elapsed_s(now)
    inst = dict(index=0, running=3, waiting=4, kv_utilization=0.5, free_tokens=10, holds_program_kv=True)
    assert rt.InstanceView(**inst).inflight == pcb.InstanceView(**inst).inflight == 7


def test_generated_block_is_marked_and_keeps_the_field_comments(runtime):
    _, out = runtime
    text = (out / "runtime.py").read_text()
    assert "Generated at export time from simcore/pcb.py" in text and schema.MARKER not in text
    assert "attained_service_s: float           # A_p(t), paper Eq. 3" in text


def test_a_field_added_to_the_simulator_reaches_the_export(monkeypatch):
    """Generated, not hand-kept: a new observable field appears in the export's source."""
    @dataclasses.dataclass(frozen=True, slots=True)
    class ProgramView:
        """Toy view."""
        program_id: str
        queue_rank: int | None      # new: position in the waiting queue
        weight: float = 1.5

        def doubled(self) -> float:
            return 2 * self.weight

    monkeypatch.setattr(schema, "view_classes", lambda: [(ProgramView, frozenset({"program_id", "queue_rank",
                                                                                    "weight"}))])
    src = schema.schema_source()
    assert "    queue_rank: int | None" in src and "# new: position in the waiting queue" in src
    assert "    weight: float = 1.5" in src
    mod = schema.build(src)
    assert mod.ProgramView("p", 3).doubled() == 3.0


def test_allow_list_disagreeing_with_the_class_stops_the_export(monkeypatch):
    monkeypatch.setattr(schema, "view_classes", lambda: [(pcb.ProgramView, pcb.OBSERVABLE_PCB_FIELDS | {"secret"})])
    with pytest.raises(RunsError, match="disagree with its OBSERVABLE"):
        schema.schema_source()
