"""Tests of the Rust planner's Python bindings (``mosaic._core``, crates/mosaic-py): no PyTorch.

Run after ``pip install .`` or ``maturin develop``: ``pytest python/tests``.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import pytest

import mosaic

STRATEGIES = [
    "Megatron-LM",
    "DistMM",
    "Spindle",
    "DistTrain",
    "FlowTrain",
    "Mosaic (GAHC)",
    "Mosaic (exact)",
]


def sample(dp, sm, time_ms, mem_gib=1.0):
    return {"dp": dp, "sm": sm, "time_ms": time_ms, "mem_gib": mem_gib, "sm_util": 0.5, "bw_util": 0.2}


def small_profile():
    """Two encoders that stop scaling at half a GPU and a head after both (the crate docs'
    example): on one GPU the optimum is [a, b] at 0.5 + 0.5, then the head, 200 ms."""
    module = lambda name, after: {
        "name": name,
        "after": after,
        "samples": [sample(1, 0.5, 100.0), sample(1, 1.0, 100.0)],
    }
    return {
        "format": "mosaic-profiles/1",
        "device": {"name": "gpu", "sm_count": 100, "memory_gib": 80.0},
        "modules": [module("a", []), module("b", []), module("head", ["a", "b"])],
        "interference": {"e1": 0.0, "e2": 0.0, "e3": 0.0},
    }


@pytest.fixture(scope="module")
def clip():
    return mosaic.Profile.zoo("clip", "h100x8")


@pytest.fixture(scope="module")
def clip_plan(clip):
    return mosaic.plan(clip, 8, search="exact", time_budget_ms=20000)


# --- the zoo, profiles and plans -----------------------------------------------------------


def test_zoo_names():
    assert {"clip", "ofasys", "imagebind"} <= set(mosaic.zoo_models())
    assert {"h100x8", "h100x32", "a100x8"} <= set(mosaic.zoo_clusters())
    assert "h100" in mosaic.zoo_devices()
    everything = mosaic.zoo()
    assert {m["name"] for m in everything["models"]} == set(mosaic.zoo_models())


def test_zoo_profile_plans_to_a_proven_optimum():
    profile = mosaic.Profile.zoo("ofasys", "h100x8")
    assert profile.zoo_model == "ofasys" and profile.zoo_cluster == "h100x8"
    assert "llm" in profile.modules
    assert profile.device["sm_count"] == 132
    plan = mosaic.plan(profile, 8, search="exact", time_budget_ms=20000)
    assert plan.optimal
    assert plan.iteration_ms > 0
    assert plan.lower_bound_ms == pytest.approx(plan.iteration_ms)
    assert plan.gpus == 8 and plan.device == "H100-SXM5-80GB"
    assert plan.model == "ofasys" and plan.cluster == "h100x8"
    # An H100's quotas are whole SMs of its 132: 8-SM partitions, or all 132 alone.
    assert plan.sm_count == 132
    sms = [m["sm"] * 132 for st in plan.stages for m in st["modules"]]
    assert all(abs(n - 8 * round(n / 8)) < 1e-3 or n == 132 for n in sms), sms
    assert "SMs per GPU" in str(plan)
    assert plan.search in ("gahc", "local", "exact")
    # Every module placed exactly once, stage times adding up to the iteration.
    placed = [m["name"] for st in plan.stages for m in st["modules"]]
    assert sorted(placed) == sorted(profile.modules)
    assert sum(st["time_ms"] for st in plan.stages) == pytest.approx(plan.iteration_ms, abs=1e-2)
    text = str(plan)
    assert "ofasys on h100x8" in text and "proven optimal" in text and "stage 1" in text
    assert "llm" in text
    assert "optimal" in repr(plan)


def test_gpus_default_to_the_zoo_cluster(clip):
    assert mosaic.plan(clip, search="gahc").gpus == 8


def test_small_profile_plans_exactly():
    profile = mosaic.Profile.from_dict(small_profile(), name="small.json")
    plan = mosaic.plan(profile, 1, search="exact")
    assert plan.optimal
    assert plan.iteration_ms == 200.0
    assert [sorted(m["name"] for m in st["modules"]) for st in plan.stages] == [["a", "b"], ["head"]]
    # Planned from a file-like profile: no zoo model or cluster, no partition rule.
    assert plan.model is None and plan.cluster is None and plan.sm_count is None


def test_profile_round_trips(tmp_path, clip):
    d = clip.to_dict()
    assert d["format"] == "mosaic-profiles/1"
    again = mosaic.Profile.from_dict(d)
    assert again == clip and again.modules == clip.modules
    path = tmp_path / "clip.json"
    clip.write(path)
    from_file = mosaic.Profile.from_file(path)
    assert from_file == clip and from_file.name == str(path)
    assert json.loads(path.read_text()) == json.loads(clip.to_json())
    assert mosaic.Profile.from_json(clip.to_json()) == clip
    # A path as a plain string works too, and plan() takes a dict or a path directly.
    assert mosaic.Profile.from_file(str(path)) == clip
    assert mosaic.plan(str(path), 8, search="gahc").iteration_ms > 0
    assert mosaic.plan(d, 8, search="gahc").iteration_ms > 0


def test_plan_round_trips_through_dict_json_and_file(tmp_path, clip_plan):
    d = clip_plan.to_dict()
    assert d["format"] == "mosaic-plan/1"
    assert d["iteration_ms"] == clip_plan.iteration_ms and d["optimal"] == clip_plan.optimal
    assert mosaic.Plan.from_dict(d) == clip_plan
    assert json.loads(clip_plan.to_json()) == d
    assert mosaic.Plan.from_json(clip_plan.to_json()) == clip_plan
    path = tmp_path / "plan.json"
    clip_plan.write(path)
    again = mosaic.Plan.from_file(path)
    assert again == clip_plan
    assert again.stages == clip_plan.stages
    assert again.lower_bound_ms == clip_plan.lower_bound_ms


def test_compare_rows(clip):
    rows = mosaic.compare(clip, 8, time_budget_ms=5000)
    assert [r["name"] for r in rows] == STRATEGIES
    for r in rows:
        assert {"strategy", "name", "iteration_ms", "mean_util", "min_util", "description", "note", "plan"} <= set(r)
        assert r["iteration_ms"] > 0 and 0.0 <= r["min_util"] <= r["mean_util"] <= 1.0
    exact = rows[-1]
    assert exact["strategy"] == "mosaic-exact" and exact["mosaic_exact_speedup"] == 1.0
    # Mosaic is never slower than the staged baselines it generalises.
    by_name = {r["name"]: r for r in rows}
    assert exact["iteration_ms"] <= by_name["Megatron-LM"]["iteration_ms"] + 1e-6
    assert exact["iteration_ms"] <= by_name["DistMM"]["iteration_ms"] + 1e-6
    # A staged row's plan reads back as a Plan.
    assert mosaic.Plan.from_dict(exact["plan"]).iteration_ms == pytest.approx(exact["iteration_ms"])


def test_simulate_writes_trace_and_svg(tmp_path, clip, clip_plan):
    trace, svg = tmp_path / "trace.json", tmp_path / "plan.svg"
    report = mosaic.simulate(clip_plan, clip, trace=trace, svg=svg)
    assert report["iteration_ms"] > 0
    assert report["predicted_ms"] == clip_plan.iteration_ms
    assert report["prediction_error"] == pytest.approx(report["iteration_ms"] / report["predicted_ms"] - 1)
    assert 0 < report["mean_utilisation"] <= 1 and 0 <= report["min_utilisation"] <= report["mean_utilisation"]
    assert len(report["stages"]) == len(clip_plan.stages)
    assert "slices" not in report and report["notes"] == []
    events = json.loads(trace.read_text())["traceEvents"]
    assert len(events) > 10
    assert svg.read_text().startswith("<svg")
    # The plan names its model and cluster, so the profile is optional; slices on request.
    full = mosaic.simulate(clip_plan, slices=True)
    assert full["slices"] and full["iteration_ms"] == pytest.approx(report["iteration_ms"])


def test_simulate_on_another_cluster_says_so(clip_plan):
    report = mosaic.simulate(clip_plan, cluster="h100x16")
    assert report["cluster"] == "h100x16"
    assert any("simulating it on h100x16" in n for n in report["notes"])


def test_simulate_needs_a_zoo_model():
    plan = mosaic.plan(mosaic.Profile.from_dict(small_profile()), 1)
    with pytest.raises(mosaic.MosaicError, match=r"names no model \(field `model`\).*model=NAME"):
        mosaic.simulate(plan)


def test_fit_on_simulated_colocations(tmp_path, clip):
    colocations = mosaic.simulate_colocations("clip", "h100x8", 60, seed=3)
    assert len(colocations) == 60 and colocations.device == "H100-SXM5-80GB"
    assert mosaic.Colocations.from_dict(colocations.to_dict()).to_dict() == colocations.to_dict()
    path = tmp_path / "c.json"
    colocations.write(path)
    assert len(mosaic.Colocations.from_file(path)) == 60
    out, svg = tmp_path / "fitted.json", tmp_path / "scatter.svg"
    result = mosaic.fit(clip, path, out=out, svg=svg)
    e = result["interference"]
    assert set(e) == {"e1", "e2", "e3"} and all(v >= 0 and math.isfinite(v) for v in e.values())
    assert [m["model"] for m in result["fit"]["models"]] == ["unaware", "additive", "full"]
    assert result["fit"]["samples"] == 60
    assert result["surface"]["leave_one_out"]["points"] > 0
    assert result["surface"]["dense"] is not None  # a zoo profile: checked against the device model
    fitted = result["profile"]
    assert isinstance(fitted, mosaic.Profile) and fitted.interference == e
    assert mosaic.Profile.from_file(out) == fitted
    assert svg.read_text().startswith("<svg")
    assert mosaic.plan(fitted, 8, search="gahc").iteration_ms > 0
    # The same fit from the objects themselves.
    assert mosaic.fit(clip, colocations)["interference"] == e


def test_with_interference(clip):
    p = clip.with_interference(0.01, 0.1, 0.0)
    assert p.interference == {"e1": 0.01, "e2": 0.1, "e3": 0.0}
    assert p.modules == clip.modules and p.zoo_model == "clip"
    with pytest.raises(mosaic.MosaicError, match=r"interference\.e1"):
        clip.with_interference(-1.0, 0.0, 0.0)
    with pytest.raises(mosaic.MosaicError, match="interference"):
        clip.with_interference(float("nan"), 0.0, 0.0)


# --- bad input: MosaicError naming the field, never a crash ---------------------------------


def test_mosaic_error_is_a_value_error():
    assert issubclass(mosaic.MosaicError, ValueError)


def test_bad_field_is_named():
    d = small_profile()
    d["modules"][0]["samples"][0]["sm"] = 1.5
    with pytest.raises(mosaic.MosaicError, match=r"^mine\.json: field `modules\[0\]\.samples\[0\]\.sm`: expected an SM quota in \(0, 1\]"):
        mosaic.Profile.from_dict(d, name="mine.json")
    d = small_profile()
    del d["modules"][1]["samples"][1]["time_ms"]
    with pytest.raises(mosaic.MosaicError, match=r"^<dict>: field `modules\[1\]\.samples\[1\]`: missing field `time_ms`$"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["modules"][2]["after"] = ["nope"]
    with pytest.raises(mosaic.MosaicError, match=r"modules\[2\]\.after"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["format"] = "mosaic-plan/1"
    with pytest.raises(mosaic.MosaicError, match=r"field `format`: expected \"mosaic-profiles/1\""):
        mosaic.Profile.from_dict(d)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_numbers_are_refused(value):
    d = small_profile()
    d["modules"][0]["samples"][0]["sm"] = value
    with pytest.raises(mosaic.MosaicError, match=r"field `modules\[0\]\.samples\[0\]\.sm`: expected a finite number"):
        mosaic.Profile.from_dict(d)


def test_wrong_types_are_refused():
    d = small_profile()
    d["device"] = [d["device"]]  # a list where a dict is expected
    with pytest.raises(mosaic.MosaicError, match=r"field `device"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["modules"][0] = "a"
    with pytest.raises(mosaic.MosaicError, match=r"field `modules\[0\]`: invalid type: string"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["modules"][0]["samples"][0]["dp"] = "1"
    with pytest.raises(mosaic.MosaicError, match=r"field `modules\[0\]\.samples\[0\]\.dp`"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["modules"][0]["samples"][0]["dp"] = 2**70
    with pytest.raises(mosaic.MosaicError, match=r"field `modules\[0\]\.samples\[0\]\.dp`: the integer .* out of range"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["modules"][0]["samples"][0]["sm"] = object()
    with pytest.raises(mosaic.MosaicError, match=r"field `modules\[0\]\.samples\[0\]\.sm`: expected a JSON value"):
        mosaic.Profile.from_dict(d)
    d = small_profile()
    d["device"][3] = "x"  # a key that is no string
    with pytest.raises(mosaic.MosaicError, match=r"field `device`: expected string keys"):
        mosaic.Profile.from_dict(d)
    with pytest.raises(mosaic.MosaicError, match=r"field `\(root\)`: expected a dict"):
        mosaic.Profile.from_dict([small_profile()])
    cyclic: dict = {}
    cyclic["x"] = cyclic
    with pytest.raises(mosaic.MosaicError, match="nested more than 128 levels"):
        mosaic.Profile.from_dict(cyclic)
    with pytest.raises(mosaic.MosaicError, match=r"profile: expected a mosaic.Profile"):
        mosaic.plan(42, 8)
    with pytest.raises(mosaic.MosaicError, match=r"field `\(file\)`: missing field"):
        mosaic.Plan.from_dict({"format": "mosaic-plan/1"})
    with pytest.raises(mosaic.MosaicError, match=r"field `samples`: expected at least one colocation"):
        mosaic.Colocations.from_dict({"format": "mosaic-colocations/1", "device": "gpu", "samples": []})


def test_tuples_and_numpy_like_scalars_are_json():
    class Index:  # like numpy.int64
        def __index__(self):
            return 1

    class Float:  # like numpy.float32
        def __float__(self):
            return 0.5

    d = small_profile()
    d["modules"][0]["samples"][0] = {**d["modules"][0]["samples"][0], "dp": Index(), "sm": Float()}
    d["modules"] = tuple(d["modules"])
    assert mosaic.Profile.from_dict(d).modules == ["a", "b", "head"]


def test_missing_files_are_named(tmp_path):
    missing = tmp_path / "nope.json"
    for read in (mosaic.Profile.from_file, mosaic.Plan.from_file, mosaic.Colocations.from_file):
        with pytest.raises(mosaic.MosaicError, match=rf"{missing}: cannot read"):
            read(missing)
    with pytest.raises(mosaic.MosaicError, match=r"nope\.json"):
        mosaic.plan(str(missing), 8)


def test_unwritable_outputs_are_named(tmp_path, clip, clip_plan):
    target = tmp_path / "missing-dir" / "x.json"
    with pytest.raises(mosaic.MosaicError, match="the directory .*missing-dir does not exist"):
        clip.write(target)
    with pytest.raises(mosaic.MosaicError, match="is a directory"):
        clip_plan.write(tmp_path)
    with pytest.raises(mosaic.MosaicError, match=r"^trace .*missing-dir"):
        mosaic.simulate(clip_plan, trace=target)


def test_bad_arguments(clip):
    cases = [
        (lambda: mosaic.plan(clip, 0), r"gpus: expected at least 1 GPU"),
        (lambda: mosaic.plan(clip, 10**6), r"gpus: expected at most"),
        (lambda: mosaic.plan(clip, 8, search="fast"), r"search: expected \"gahc\", \"exact\" or \"auto\""),
        (lambda: mosaic.plan(clip, 8, granularity=0.3), r"granularity: expected a quota step"),
        (lambda: mosaic.plan(clip, 8, granularity=float("nan")), r"granularity"),
        (lambda: mosaic.plan(clip, 8, time_budget_ms=-1), r"time_budget_ms: expected a time in ms"),
        (lambda: mosaic.plan(small_profile()), r"gpus: required for <dict>"),
        (lambda: mosaic.compare(small_profile()), r"gpus: required"),
        (lambda: mosaic.compare(clip, 8, global_batch=0), r"global_batch"),
        (lambda: mosaic.compare(clip, 8, slice_sync_ms=float("nan")), r"slice_sync_ms"),
        (lambda: mosaic.Profile.zoo("gpt5", "h100x8"), r"unknown model \"gpt5\""),
        (lambda: mosaic.Profile.zoo("clip", "tpu"), r"tpu"),
        (lambda: mosaic.simulate_colocations("clip", "h100x8", 0), r"count: expected 1 to 100000"),
        (lambda: mosaic.fit(clip, mosaic.simulate_colocations("clip", "h100x8", 10), holdout_every=1), r"holdout_every"),
    ]
    for call, message in cases:
        with pytest.raises(mosaic.MosaicError, match=message):
            call()


def test_a_module_that_fits_nowhere_is_named():
    d = small_profile()
    for s in d["modules"][2]["samples"]:
        s["mem_gib"] = 100.0  # more than the device's 80 GiB
    with pytest.raises(mosaic.MosaicError, match=r"field `modules\[2\]\.samples`: module \"head\" fits on no GPU"):
        mosaic.plan(d, 1)
    d = small_profile()
    for s in d["modules"][1]["samples"]:
        s["dp"] = 2  # profiled on two GPUs only, planned on one
    with pytest.raises(mosaic.MosaicError, match=r"^<dict>: field `modules\[1\]\.samples`: no plan: "):
        mosaic.plan(d, 1)


def test_a_panic_is_an_internal_error_not_a_crash():
    with pytest.raises(mosaic.MosaicError, match="internal error: a deliberate panic"):
        mosaic._core._panic_for_tests()


def test_bad_colocations_field_is_named(clip):
    d = mosaic.simulate_colocations("clip", "h100x8", 5).to_dict()
    d["samples"][0]["modules"][1]["sm"] = 0.0
    with pytest.raises(mosaic.MosaicError, match=r"^c\.json: field `samples\[0\]\.modules\[1\]\.sm`: expected an SM quota in \(0, 1\]"):
        mosaic.Colocations.from_dict(d, name="c.json")
    d = mosaic.simulate_colocations("clip", "h100x8", 5).to_dict()
    d["samples"][0]["modules"][0]["name"] = "nope"
    with pytest.raises(mosaic.MosaicError, match="nope"):
        mosaic.fit(clip, d)


def test_plans_in_threads_release_the_gil(clip):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        plans = list(pool.map(lambda _: mosaic.plan(clip, 8, search="gahc"), range(4)))
    assert len({p.iteration_ms for p in plans}) == 1


def test_inputs_are_not_modified():
    d = small_profile()
    before = copy.deepcopy(d)
    mosaic.plan(d, 1)
    assert d == before


# --- the package ---------------------------------------------------------------------------


def test_import_does_not_import_torch():
    code = "import sys, mosaic; assert 'torch' not in sys.modules; assert 'mosaic.torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_torch_submodule_is_lazy():
    assert "torch" in dir(mosaic)
    with pytest.raises(AttributeError):
        mosaic.no_such_thing  # noqa: B018


def test_everything_public_has_a_docstring():
    for name in mosaic.__all__:
        if name == "__version__":
            continue
        obj = getattr(mosaic, name)
        assert obj.__doc__ and len(obj.__doc__) > 20, name
    for cls in (mosaic.Profile, mosaic.Plan, mosaic.Colocations):
        for attr, member in vars(cls).items():
            if not attr.startswith("_"):
                assert member.__doc__, f"{cls.__name__}.{attr}"
    assert mosaic.__version__ == "0.1.0"
