"""Tests of mosaic.torch_zoo (the zoo's modules in PyTorch) and examples/python/measure_zoo.py:
on the CPU with PyTorch at a small size, and on a CUDA GPU at the zoo's real size (skipped
without one). The zoo comes from the native module or the `mosaic` binary."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "python" / "measure_zoo.py"


def _load(name):
    spec = importlib.util.spec_from_file_location(
        f"mosaic_{name}_under_test", ROOT / "python" / "mosaic" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tz = _load("torch_zoo")
mt = _load("torch")


@pytest.fixture(scope="module")
def zoo(mosaic_binary):
    if mosaic_binary is None:
        pytest.skip("no mosaic binary (cargo build --release -p mosaic-cli, or set MOSAIC_BIN)")
    out = subprocess.run([mosaic_binary, "zoo", "--json"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return json.loads(out)


def _model(zoo, name):
    return next(m for m in zoo["models"] if m["name"] == name)


def test_the_device_table_is_the_zoos(zoo):
    assert {(d["name"], d["short_name"]) for d in zoo["devices"]} == set(tz.DEVICES)
    assert tz.zoo_device("NVIDIA H100 80GB HBM3") == "H100-SXM5-80GB"
    assert tz.zoo_device("NVIDIA H200") == "H200-SXM-141GB"
    assert tz.zoo_device("NVIDIA A100-SXM4-80GB") == "A100-SXM4-80GB"
    assert tz.zoo_device("NVIDIA GeForce RTX 4090") is None
    assert tz.zoo_device("NVIDIA GH200 480GB") is None
    assert tz.zoo_device("NVIDIA H100 PCIe") is None
    assert tz.short_name("H100-SXM5-80GB") == "h100" and tz.short_name("CPU") is None


def test_imagebind_builds_its_seven_modules_at_the_zoos_shapes(zoo):
    spec = _model(zoo, "imagebind")
    modules, after, inputs = tz.modules(spec, size=0.05)
    assert list(modules) == [m["name"] for m in spec["modules"]]
    assert after["align"] == ["vision", "text", "audio", "depth", "thermal", "imu"]
    for m in spec["modules"]:
        net = modules[m["name"]]
        trainable = any(p.requires_grad for p in net.parameters())
        assert trainable == m["trainable"], m["name"]
        if m["layers"]:
            assert len(net.blocks) == m["layers"]
            assert net.blocks[0].heads == m["heads"]
    # The real size, on the meta device (no memory): depth is 12 blocks of 384 over 197 tokens.
    with torch.device("meta"):
        full, _, full_inputs = tz.modules(spec)
    depth = full["depth"]
    assert depth.norm.normalized_shape == (384,) and len(depth.blocks) == 12
    assert full_inputs["depth"](2)[0].shape == (2, 197, 384)
    assert [p.in_features for p in full["align"].proj] == [1024, 768, 768, 384, 768, 512]


def test_a_small_imagebind_steps_forward_and_backward(zoo):
    modules, after, inputs = tz.modules(_model(zoo, "imagebind"), size=0.05)
    for name, net in modules.items():
        out = net(*inputs[name](3))
        if name == "align":
            assert out.dim() == 0 and torch.isfinite(out)
            out.backward()
            assert all(p.grad is not None for p in net.parameters())
        else:
            assert out.shape[0] == 3 and torch.isfinite(out).all()
    causal = modules["text"].blocks[0]
    assert causal.causal and not modules["vision"].blocks[0].causal


def test_models_it_cannot_build_are_refused_naming_the_module(zoo):
    with pytest.raises(ValueError, match="'text' .role embedding"):
        tz.modules(_model(zoo, "qwen3-vl"))
    with pytest.raises(ValueError, match="'llm': decoder layers or a vocabulary head"):
        tz.modules(_model(zoo, "ofasys"))
    with pytest.raises(ValueError, match="size"):
        tz.modules(_model(zoo, "clip"), size=0)
    with pytest.raises(ValueError, match="size"):
        tz.modules(_model(zoo, "clip"), size=2)


def test_a_small_clip_profiles_on_the_cpu_and_the_planner_takes_it(zoo, tmp_path,
                                                                    mosaic_binary):
    spec = _model(zoo, "clip")
    modules, after, inputs = tz.modules(spec, size=0.02)
    prof = mt.profile(modules, after, inputs, global_batch=4, batches=[4, 2], device="cpu",
                      optimizer=tz.fused_adamw, warmup=0, reps=1)
    assert [m["name"] for m in prof["modules"]] == ["vision", "text", "align"]
    f = tmp_path / "p.json"
    f.write_text(json.dumps(prof))
    r = subprocess.run([mosaic_binary, "plan", "--profiles", str(f), "--gpus", "2", "--json"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["iteration_ms"] > 0


def test_the_example_measures_a_small_model_on_the_cpu(zoo, tmp_path, mosaic_binary):
    out = tmp_path / "ib.json"
    env = dict(os.environ, MOSAIC_BIN=mosaic_binary)
    r = subprocess.run([sys.executable, str(EXAMPLE), "--model", "imagebind", "--size", "0.03",
                        "--device", "cpu", "--batches", "2", "--reps", "1", "--warmup", "0",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    prof = json.loads(out.read_text())
    assert len(prof["modules"]) == 7
    assert "nothing to calibrate against" in r.stdout
    bad = subprocess.run([sys.executable, str(EXAMPLE), "--model", "qwen3-vl", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert bad.returncode == 2 and "'text'" in bad.stderr


def test_imagebind_at_its_real_size_on_the_gpu_calibrates(zoo, tmp_path, mosaic_binary):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    if tz.device_name(0) is None:
        pytest.skip(f"{torch.cuda.get_device_name(0)} is not a zoo device")
    out = tmp_path / "ib.json"
    env = dict(os.environ, MOSAIC_BIN=mosaic_binary)
    whole = torch.cuda.get_device_properties(0).multi_processor_count
    r = subprocess.run([sys.executable, str(EXAMPLE), "--model", "imagebind", "--quotas",
                        f"16,64,{whole}", "--out", str(out)], capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "built-in" in r.stdout
    prof = json.loads(out.read_text())
    assert prof["device"]["name"] == tz.device_name(0)
    assert all(len(m["samples"]) == 3 for m in prof["modules"])
