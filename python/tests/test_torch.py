"""Tests of mosaic.torch: the pure helpers (no PyTorch needed), CPU profiling (PyTorch), the
profile's acceptance by the planner (the native module, or the `mosaic` binary), and the GPU
paths (skipped without CUDA)."""

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "python" / "mosaic" / "torch.py"


def _load_file(path, name):
    """The Python file at `path` as a standalone module called `name`."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _has_core():
    """Whether the native module imports: find_spec of a submodule raises where its package
    (mosaic, not installed) is missing, as on a GPU machine that runs this file alone."""
    try:
        return importlib.util.find_spec("mosaic._core") is not None
    except ModuleNotFoundError:
        return False


# This checkout's mosaic/torch.py on its own: it must not need mosaic._core.
mt = _load_file(SOURCE, "mosaic_torch_under_test")
H100 = {"min_sms": 8, "step_sms": 8}
A100 = {"min_sms": 4, "step_sms": 2}


# ------------------------------------------------------------------ pure helpers, no torch


def test_granularity_follows_the_compute_capability_table():
    assert mt.granularity_for(9) == H100
    assert mt.granularity_for(10) == H100
    assert mt.granularity_for(8) == A100
    assert mt.granularity_for(7) == {"min_sms": 2, "step_sms": 2}
    assert mt.granularity_for(6) == {"min_sms": 1, "step_sms": 1}


def test_sms_for_rounds_to_partitions_like_the_planner():
    assert mt.sms_for(0.5, 132, H100) == 64
    assert mt.sms_for(0.1, 132, H100) == 16  # 13.2 SMs -> nearest multiple of 8
    assert mt.sms_for(0.01, 132, H100) == 8  # at least the minimum
    assert mt.sms_for(1.0, 132, H100) == 128  # a split hands out at most 128 of 132
    assert mt.sms_for(0.7, 132, H100) == 96
    assert mt.sms_for(0.3, 108, A100) == 32  # 32.4 -> 32
    # Half rounds away from zero (Rust's f64::round), not to even: 0.5 of 16 SMs in steps of 8.
    assert mt.sms_for(0.75, 16, {"min_sms": 8, "step_sms": 8}) == 16
    for bad in (0.0, -0.1, 1.5, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            mt.sms_for(bad, 132, H100)
    with pytest.raises(ValueError):
        mt.sms_for(0.5, 4, H100)  # no partition fits


def test_quota_grid_and_defaults():
    grid = mt.quota_grid(132, H100)
    assert grid[:3] == [8, 16, 24] and grid[-2:] == [128, 132] and len(grid) == 17
    assert mt.quota_grid(108, A100)[:2] == [4, 6] and mt.quota_grid(108, A100)[-1] == 108
    assert mt.default_quotas(132, H100) == [16, 32, 48, 64, 80, 96, 112, 132]
    assert mt.largest_within(132, H100) == 128
    assert mt.largest_within(7, H100) is None


def test_resolve_quotas_takes_sm_counts_and_fractions():
    assert mt.resolve_quotas([16, 0.5, 1.0, 132, 64], 132, H100) == [16, 64, 132]
    assert mt.resolve_quotas(None, 132, H100) == mt.default_quotas(132, H100)
    for bad in ([12], [136], [130], [0.0], [1.2], [True], ["half"], []):
        with pytest.raises(ValueError):
            mt.resolve_quotas(bad, 132, H100)


def test_partition_sms_makes_a_stage_fit_like_the_planner():
    # README: a plan's 0.7 + 0.3 becomes 88/132 + 40/132.
    assert mt.partition_sms([0.7, 0.3], 132, H100) == [88, 40]
    assert mt.partition_sms([0.5, 0.5], 132, H100) == [64, 64]
    assert mt.partition_sms([64, 0.25], 132, H100) == [64, 32]
    assert sum(mt.partition_sms([0.9, 0.9], 132, H100)) <= 128
    with pytest.raises(ValueError):
        mt.partition_sms([0.1] * 17, 132, H100)


def test_sm_fraction_reads_back_as_the_same_whole_sm_count():
    for sms in mt.quota_grid(132, H100):
        q = mt.sm_fraction(sms, 132)
        assert abs(q * 132 - sms) < 1e-3 * 132
        assert abs(round(q * 132) / 132 - q) <= mt.SM_QUOTA_TOLERANCE
    assert mt.sm_fraction(16, 132) == 0.121212
    assert mt.sm_fraction(132, 132) == 1.0


def test_batches_become_dp_degrees():
    assert mt.resolve_batches([64, 32, 16], 64) == [(64, 1), (32, 2), (16, 4)]
    assert mt.resolve_batches([16, 64], None) == [(64, 1), (16, 4)]
    assert mt.resolve_batches(None, 24) == [(24, 1), (12, 2), (6, 4), (3, 8)]
    assert mt.default_batches(12) == [12, 6, 3]
    for batches, gb in (([48], 64), ([0], 64), ([], 64), ([3], 0)):
        with pytest.raises(ValueError):
            mt.resolve_batches(batches, gb)
    with pytest.raises(ValueError):
        mt.resolve_batches(None, None)


def test_check_after_rejects_unknown_names_self_edges_and_cycles():
    names = ["a", "b", "c"]
    assert mt.check_after(names, {"c": ["a", "b"]}) == {"a": [], "b": [], "c": ["a", "b"]}
    assert mt.check_after(names, None) == {"a": [], "b": [], "c": []}
    for after in ({"d": []}, {"c": ["d"]}, {"c": ["c"]}, {"c": ["a", "a"]},
                  {"a": ["b"], "b": ["c"], "c": ["a"]}):
        with pytest.raises(ValueError):
            mt.check_after(names, after)


def test_build_profile_and_colocations_have_the_formats_fields():
    p = mt.build_profile({"name": "X", "sm_count": 4, "memory_gib": 1.0},
                         [{"name": "a", "after": [], "samples": []}], "test")
    assert set(p) == {"format", "device", "source", "modules", "interference"}
    assert p["format"] == "mosaic-profiles/1"
    assert p["interference"] == {"e1": 0.0, "e2": 0.0, "e3": 0.0}
    c = mt.build_colocations("X", [{"modules": []}], "test")
    assert c["format"] == "mosaic-colocations/1" and c["device"] == "X"


def test_the_module_imports_without_torch_and_says_what_is_missing():
    code = (
        "import sys, importlib.util\n"
        "sys.modules['torch'] = None  # import torch now fails\n"
        f"spec = importlib.util.spec_from_file_location('m', {str(SOURCE)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "assert m.sms_for(0.5, 132, m.granularity_for(9)) == 64\n"
        "try:\n"
        "    m.profile({'a': object()}, None, {'a': None}, global_batch=4, device='cpu')\n"
        "except ImportError as e:\n"
        "    assert 'pip install torch' in str(e), e\n"
        "    print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


# ------------------------------------------------------------------ with PyTorch, on the CPU


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _tiny(torch):
    nn = torch.nn
    torch.manual_seed(0)
    modules = {"img": nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.Linear(16, 8)),
               "txt": nn.Sequential(nn.Embedding(50, 8), nn.Flatten(), nn.Linear(32, 8)),
               "head": nn.Bilinear(8, 8, 2)}
    after = {"head": ["img", "txt"]}
    inputs = {"img": lambda b: torch.randn(b, 12),
              "txt": lambda b: (torch.randint(0, 50, (b, 4)),),
              "head": (torch.randn(3, 8), torch.randn(3, 8))}  # example tensors, resized
    return modules, after, inputs


@pytest.fixture(scope="module")
def cpu_profile(torch):
    modules, after, inputs = _tiny(torch)
    return mt.profile(modules, after, inputs, global_batch=8, batches=[8, 4, 2], device="cpu",
                      warmup=1, reps=3)


def test_cpu_profile_has_the_profile_structure(cpu_profile):
    p = cpu_profile
    assert p["format"] == "mosaic-profiles/1"
    assert set(p) == {"format", "device", "source", "modules", "interference"}
    assert "partition" not in p["device"]
    assert p["device"]["name"].startswith("CPU") and p["device"]["sm_count"] >= 1
    assert p["device"]["memory_gib"] > 0
    assert "CPU timings" in p["source"]
    assert [m["name"] for m in p["modules"]] == ["img", "txt", "head"]
    assert [m["after"] for m in p["modules"]] == [[], [], ["img", "txt"]]
    for m in p["modules"]:
        assert set(m) == {"name", "after", "samples", "grad_gib"}
        assert m["grad_gib"] >= 0
        assert [s["dp"] for s in m["samples"]] == [1, 2, 4]
        for s in m["samples"]:
            assert set(s) == {"dp", "sm", "time_ms", "mem_gib", "sm_util", "bw_util"}
            assert s["sm"] == 1.0
            assert s["time_ms"] > 0 and math.isfinite(s["time_ms"])
            assert s["mem_gib"] >= 0
            assert 0.0 <= s["sm_util"] <= 1.0 and s["bw_util"] == 0.0
    json.dumps(p)  # plain JSON values only


def test_cpu_profile_leaves_the_users_modules_untouched(torch):
    modules, after, inputs = _tiny(torch)
    before = {k: [p.detach().clone() for p in m.parameters()] for k, m in modules.items()}
    mt.profile_cpu(modules, after, inputs, global_batch=4, batches=[4], warmup=1, reps=1)
    for k, m in modules.items():
        for a, b in zip(before[k], m.parameters()):
            assert torch.equal(a, b)


def test_cpu_profile_runs_a_custom_step_and_a_frozen_module(torch):
    nn = torch.nn
    frozen = nn.Linear(4, 4)
    for p in frozen.parameters():
        p.requires_grad_(False)
    calls = []

    def step(module, inputs, optimizer):
        calls.append(inputs[0].shape[0])
        out = module(*inputs)
        if optimizer is not None:
            out.pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()

    p = mt.profile({"f": frozen, "g": nn.Linear(4, 1)}, None,
                   {"f": torch.randn(2, 4), "g": torch.randn(2, 4)}, global_batch=6,
                   batches=[6, 3], step=step, device="cpu", warmup=0, reps=2)
    assert {6, 3} <= set(calls)
    f = p["modules"][0]
    assert f["grad_gib"] == 0.0 and all(s["time_ms"] > 0 for s in f["samples"])


def test_cpu_mode_refuses_partitions_and_graphs(torch):
    modules, after, inputs = _tiny(torch)
    with pytest.raises(ValueError, match="quota 1.0"):
        mt.profile(modules, after, inputs, global_batch=4, quotas=[0.5], device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        mt.profile(modules, after, inputs, global_batch=4, graphs=True, device="cpu")
    with pytest.raises(ValueError, match="no inputs"):
        mt.profile(modules, after, {"img": inputs["img"]}, global_batch=4, device="cpu")


def test_profile_without_cuda_says_it_needs_a_gpu(torch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    modules, after, inputs = _tiny(torch)
    with pytest.raises(RuntimeError, match=r"mosaic.torch.profile needs a CUDA GPU: .*device=\"cpu\""):
        mt.profile(modules, after, inputs, global_batch=4)
    with pytest.raises(RuntimeError, match="mosaic.torch.colocations needs a CUDA GPU"):
        mt.colocations(modules, inputs, global_batch=4)


# ------------------------------------------------------------------ the planner takes it


def test_the_mosaic_binary_plans_a_cpu_profile(cpu_profile, tmp_path, mosaic_binary):
    binary = mosaic_binary
    if binary is None:
        pytest.skip("no mosaic binary (cargo build --release -p mosaic-cli, or set MOSAIC_BIN)")
    f = tmp_path / "p.json"
    f.write_text(json.dumps(cpu_profile))
    r = subprocess.run([binary, "plan", "--profiles", str(f), "--gpus", "4", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["iteration_ms"] > 0
    assert {m["name"] for s in plan["stages"] for m in s["modules"]} == {"img", "txt", "head"}


def _native_mosaic():
    pytest.importorskip("mosaic._core", reason="the native module mosaic._core is not built")
    import mosaic
    return mosaic


def test_native_planner_accepts_and_plans_a_cpu_profile(cpu_profile):
    mosaic = _native_mosaic()
    import mosaic.torch as installed
    assert hasattr(installed, "profile") and hasattr(installed, "profile_cpu")
    prof = mosaic.Profile.from_dict(cpu_profile, name="cpu-profile")
    plan = mosaic.plan(prof, 4)
    assert plan.iteration_ms > 0
    rows = mosaic.compare(prof, 4)
    assert any(r["name"] == "Megatron-LM" for r in rows)


# ------------------------------------------------------------------ on a CUDA GPU


def _needs_cuda(torch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")


def test_gpu_profile_on_green_contexts(torch):
    _needs_cuda(torch)
    modules, after, inputs = _tiny(torch)
    props = torch.cuda.get_device_properties(0)
    g = mt.granularity_for(props.major)
    p = mt.profile(modules, after, inputs, global_batch=8, batches=[8, 4],
                   quotas=[0.25, 0.5, 1.0], warmup=1, reps=3, util_window_s=0.2)
    assert p["device"]["partition"] == g
    assert p["device"]["sm_count"] == props.multi_processor_count
    for m in p["modules"]:
        sms = {round(s["sm"] * props.multi_processor_count) for s in m["samples"]}
        assert props.multi_processor_count in sms and len(sms) == 3
        for s in m["samples"]:
            assert s["time_ms"] > 0 and s["mem_gib"] > 0
            assert 0 <= s["sm_util"] <= 1 and 0 <= s["bw_util"] <= 1
    try:
        mosaic = _native_mosaic()
    except pytest.skip.Exception:
        return
    assert mosaic.plan(mosaic.Profile.from_dict(p), 2).iteration_ms > 0


def test_gpu_profile_with_cuda_graphs(torch):
    _needs_cuda(torch)
    modules, after, inputs = _tiny(torch)
    p = mt.profile(modules, after, inputs, global_batch=4, batches=[4], quotas=[0.5, 1.0],
                   graphs=True, warmup=2, reps=3, util_window_s=0.0)
    assert "CUDA-graph replays" in p["source"]
    assert all(s["time_ms"] > 0 for m in p["modules"] for s in m["samples"])


def test_gpu_colocations_of_a_pair(torch):
    _needs_cuda(torch)
    modules, _after, inputs = _tiny(torch)
    c, rows = mt.colocations({"img": modules["img"], "txt": modules["txt"]},
                             {"img": inputs["img"], "txt": inputs["txt"]}, global_batch=8,
                             splits=[(0.5, 0.5)], warmup=1, reps=3, details=True)
    assert c["format"] == "mosaic-colocations/1" and len(c["samples"]) == 1
    mods = c["samples"][0]["modules"]
    assert [m["name"] for m in mods] == ["img", "txt"]
    assert sum(m["sm"] for m in mods) <= 1.0
    assert all(r["alone_ms"] > 0 and r["together_ms"] > 0 for r in rows)


# ------------------------------------------------------------------ the GPU code path, faked
# No GPU here: run profile()'s and colocations()' CUDA path on CPU tensors with torch.cuda's
# calls replaced by stand-ins, to check its control flow and the files it writes (not timings).


class _FakeStream:
    def synchronize(self):
        pass

    def wait_stream(self, other):
        pass


class _FakeEvent:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        import time
        self.t = time.perf_counter()

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


class _FakeGraph:
    def replay(self):
        import time
        time.sleep(0.0005)


@pytest.fixture
def fake_cuda(torch, monkeypatch):
    import contextlib
    import types
    props = types.SimpleNamespace(name="Fake H100", multi_processor_count=132, major=9, minor=0,
                                  total_memory=80 * 2**30, uuid=None)
    c = torch.cuda
    monkeypatch.setattr(mt, "_cuda_device", lambda torch, device, who="": torch.device("cpu"))
    monkeypatch.setattr(c, "get_device_properties", lambda dev=None: props)
    monkeypatch.setattr(c, "Stream", lambda *a, **k: _FakeStream())
    monkeypatch.setattr(c, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(c, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(c, "Event", _FakeEvent)
    monkeypatch.setattr(c, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(c, "graph", lambda g, stream=None: contextlib.nullcontext())
    for f in ("synchronize", "empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(c, f, lambda *a, **k: None)
    monkeypatch.setattr(c, "current_stream", lambda *a, **k: _FakeStream())
    monkeypatch.setattr(c, "memory_allocated", lambda *a, **k: 0)
    monkeypatch.setattr(c, "max_memory_allocated", lambda *a, **k: 3 * 2**20)
    asked = []

    class FakeGreen:
        def __init__(self, torch, dev, backend):
            pass

        def describe(self):
            return "fake green contexts"

        def slots(self, counts):
            asked.append(list(counts))
            return [mt._Slot(_FakeStream(), n) for n in counts]

    class NoNvml:
        ok, error = False, "fake: no NVML"

        def __init__(self, torch, dev):
            pass

    monkeypatch.setattr(mt, "_GreenContexts", FakeGreen)
    monkeypatch.setattr(mt, "_Nvml", NoNvml)
    return asked


@pytest.mark.parametrize("graphs", [False, True])
def test_gpu_path_writes_whole_sm_samples_and_the_partition(torch, fake_cuda, graphs,
                                                            mosaic_binary):
    modules, after, inputs = _tiny(torch)
    opt = (lambda ps: torch.optim.AdamW(ps, lr=1e-4)) if graphs else None
    p = mt.profile(modules, after, inputs, global_batch=8, batches=[8, 2],
                   quotas=[16, 0.5, 1.0], warmup=1, reps=2, graphs=graphs, optimizer=opt)
    assert p["device"] == {"name": "Fake H100", "sm_count": 132, "memory_gib": 80.0,
                           "partition": {"min_sms": 8, "step_sms": 8}}
    assert fake_cuda == [[16], [64]]  # one pooled green context per partial quota
    for m in p["modules"]:
        pts = [(s["dp"], round(s["sm"] * 132)) for s in m["samples"]]
        assert pts == [(1, 16), (1, 64), (1, 132), (4, 16), (4, 64), (4, 132)]
        for s in m["samples"]:
            assert s["time_ms"] > 0 and s["mem_gib"] == round(3 / 1024, 6)
            assert (s["sm_util"], s["bw_util"]) == (1.0, 0.0)
    assert "NVML unavailable (fake: no NVML)" in p["source"]
    assert ("CUDA-graph replays" in p["source"]) == graphs
    binary = mosaic_binary
    if binary is not None:
        import tempfile
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(p, f)
        r = subprocess.run([binary, "plan", "--profiles", f.name, "--gpus", "2"],
                           capture_output=True, text=True, timeout=60)
        os.unlink(f.name)
        assert r.returncode == 0, r.stderr


def test_gpu_path_colocations_write_a_colocations_file(torch, fake_cuda):
    modules, _after, inputs = _tiny(torch)
    c, rows = mt.colocations({"img": modules["img"], "txt": modules["txt"]},
                             {"img": inputs["img"], "txt": inputs["txt"]}, global_batch=8,
                             batch=4, warmup=1, reps=2, details=True)
    assert fake_cuda == [[32, 96], [64, 64], [96, 32]]
    assert c["format"] == "mosaic-colocations/1" and c["device"] == "Fake H100"
    assert len(c["samples"]) == 3 and len(rows) == 6
    for s in c["samples"]:
        assert [m["name"] for m in s["modules"]] == ["img", "txt"]
        assert all(m["dp"] == 2 and m["time_ms"] > 0 for m in s["modules"])
        assert sum(m["sm"] for m in s["modules"]) <= 1.0
    assert all(r["alone_ms"] > 0 and r["stage_ms"] > 0 for r in rows)


def test_gpu_path_files_are_read_and_fitted_by_the_native_module(torch, fake_cuda):
    mosaic = _native_mosaic()
    modules, _after, inputs = _tiny(torch)
    pair = {"img": modules["img"], "txt": modules["txt"]}
    ins = {"img": inputs["img"], "txt": inputs["txt"]}
    p = mt.profile(pair, None, ins, global_batch=8, batches=[8, 4], warmup=0, reps=1)
    c = mt.colocations(pair, ins, global_batch=8, batch=4, warmup=0, reps=1,
                       splits=[(0.25, 0.75), (0.5, 0.5), (0.75, 0.25), (16, 0.5), (0.5, 16)])
    prof = mosaic.Profile.from_dict(p, name="fake-gpu-profile")
    assert prof.device["partition"] == {"min_sms": 8, "step_sms": 8}
    coloc = mosaic.Colocations.from_dict(c, name="fake-gpu-colocations")
    assert len(coloc) == 5
    fitted = mosaic.fit(prof, coloc)
    assert fitted  # e1, e2, e3 and the accuracy, whatever the (fake) timings say
    assert mosaic.plan(prof, 2).iteration_ms > 0


# ------------------------------------------------------------------ the two-encoder example
TWO_ENCODERS = ROOT / "examples" / "python" / "two_encoders.py"


def test_the_two_encoder_example_profiles_and_plans_on_the_cpu(torch, tmp_path, mosaic_binary):
    out = tmp_path / "two.json"
    r = subprocess.run([sys.executable, str(TWO_ENCODERS), "--device", "cpu", "--gpus", "4",
                        "--global-batch", "16", "--reps", "1", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    assert [m["name"] for m in prof["modules"]] == ["image", "text", "fusion"]
    assert prof["modules"][2]["after"] == ["image", "text"]
    if _has_core():
        assert "predicted speed-up" in r.stdout and "stage 1" in r.stdout, r.stdout
    else:
        assert f"mosaic plan --profiles {out}" in r.stdout, r.stdout
    if mosaic_binary is not None:
        p = subprocess.run([mosaic_binary, "plan", "--profiles", str(out), "--gpus", "4"],
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
    bad = subprocess.run([sys.executable, str(TWO_ENCODERS), "--gpus", "0"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--gpus must be at least 1" in bad.stderr


def test_the_two_encoder_example_on_the_gpu_path_plans_whole_partitions(torch, fake_cuda,
                                                                        tmp_path, capsys):
    mosaic = _native_mosaic()
    example = _load_file(TWO_ENCODERS, "two_encoders_under_test")
    example.import_mosaic = lambda: (mosaic, mt)  # the GPU path faked above, in this module
    out = tmp_path / "two.json"
    assert example.main(["--device", "cuda", "--gpus", "2", "--global-batch", "8",
                         "--reps", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    prof = json.loads(out.read_text())
    assert prof["device"]["partition"] == H100 and prof["device"]["sm_count"] == 132
    for m in prof["modules"]:
        sms = {round(s["sm"] * 132) for s in m["samples"]}
        assert 132 in sms and len(sms) > 2
        assert all(n == 132 or (n % 8 == 0 and n <= 128) for n in sms), sms
        assert sorted({s["dp"] for s in m["samples"]}) == [1, 2]
    assert "predicted speed-up" in printed, printed
    plan = mosaic.plan(mosaic.Profile.from_dict(prof, name=str(out)), 2)
    assert plan.iteration_ms > 0
