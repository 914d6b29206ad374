"""The benchmark's ``naive-resort`` baseline must compute the same admissions as the engine, or the side-by-side
latency comparison in benchmarks/admission_engine.py would compare different work."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from knittrans.admission.engine import AdmissionState, Admit, decide

BENCHMARK = Path(__file__).resolve().parents[3] / "benchmarks" / "admission_engine.py"


def load_benchmark() -> ModuleType:
    spec = importlib.util.spec_from_file_location("admission_engine_benchmark", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_baseline_admits_what_the_engine_admits() -> None:
    bench = load_benchmark()
    state = AdmissionState(bench.engine_config())
    targets = state.targets
    naive = bench.NaiveEngine(list(targets.quotas), targets.sizes, targets.source_alpha)
    engine_entries, naive_entries = bench.EntryFactory(seed=5), bench.EntryFactory(seed=5)
    source_index = {name: i for i, name in enumerate(bench.SOURCES)}

    def add(source: str | None = None) -> None:
        state.add(engine_entries.next(source))
        entry = naive_entries.next(source)
        naive.pool.append((entry.oldest_version, entry.ready_at, entry.trajectory_id, source_index[entry.source]))

    for _ in range(400):
        add()
    for step in range(24):
        decision = decide(state, float(step), state.train_version)
        taken = naive.decide()
        assert isinstance(decision, Admit) and taken is not None
        assert tuple(item[2] for item in taken) == decision.trajectory_ids
        state.apply(decision)
        naive.apply(taken)
        for trajectory_id in decision.trajectory_ids:
            add(engine_entries.source_of[trajectory_id])
