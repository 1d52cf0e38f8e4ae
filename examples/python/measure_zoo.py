"""Measure a built-in model's modules as PyTorch trains them, on this GPU, for `mosaic calibrate`.

The zoo's device model predicts every module's step; this script measures the same
architectures the way the paper's engine trains them (PyTorch eager, bf16 autocast, fused
AdamW, ``scaled_dot_product_attention``; frozen modules forward only) with
``mosaic.torch.profile`` on CUDA green-context SM partitions, writes the ``mosaic-profiles/1``
file (``--out``), and, where the ``mosaic`` binary is at hand (``$MOSAIC_BIN`` or the PATH),
runs ``mosaic calibrate`` on it: its ``built-in`` columns are the device model's error on these
measurements.

    python examples/python/measure_zoo.py --model imagebind                  # dp 1, 6 quotas
    python examples/python/measure_zoo.py --model clip --batches 16,8,4,2 --out clip.json
    python examples/python/measure_zoo.py --model imagebind --size 0.05 --device cpu   # anywhere

Modules are the zoo's at ``--size`` 1.0 (see ``mosaic.torch_zoo``: towers over embedded
sequences and contrastive heads; the embeddings are left out). Needs PyTorch, and on a GPU
``nvidia-ml-py`` and ``cuda-bindings`` (or a PyTorch with ``torch.cuda.green_contexts``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import torch


def load(name: str):
    """``mosaic.<name>`` from the installed package, else straight from this checkout's file
    (the pure-Python modules need no native ``mosaic._core``)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.normpath(os.path.join(here, "..", "..", "python", "mosaic", f"{name}.py"))
    try:
        return importlib.import_module(f"mosaic.{name}")
    except ImportError:
        spec = importlib.util.spec_from_file_location(f"mosaic_{name}_standalone", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="imagebind", help="a zoo model of towers and "
                    "contrastive heads: clip or imagebind (default imagebind)")
    ap.add_argument("--batches", type=ints, default=None,
                    help="per-GPU batches, comma-separated (default: the model's batch on one "
                         "node, i.e. dp 1)")
    ap.add_argument("--quotas", type=ints, default=None,
                    help="SM counts to measure at, comma-separated; the GPU's own count is "
                         "the whole GPU, an ordinary stream (default 16,40,64,96,120 below "
                         "it, and the whole GPU)")
    ap.add_argument("--size", type=float, default=1.0, help="scale of widths and tokens "
                    "(default 1.0, the zoo's real size)")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per sample (median)")
    ap.add_argument("--warmup", type=int, default=1, help="warm-up steps per sample")
    ap.add_argument("--out", default=None, help="the profile (default MODEL-measured.json)")
    args = ap.parse_args(argv)

    mt, tz = load("torch"), load("torch_zoo")
    torch.manual_seed(0)  # the modules' weights, then the inputs
    try:
        spec = tz.model_spec(args.model)
        modules, after, inputs = tz.modules(spec, args.size)
    except (RuntimeError, ValueError) as e:
        ap.error(f"--model {args.model}: {e}")
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    gb = spec["single_node_batch"]
    batches = args.batches or [gb]
    out = args.out or f"{args.model}-measured.json"
    print(f"measuring {args.model} (size {args.size}) on {device}: per-GPU batches {batches} of "
          f"{gb}", file=sys.stderr)
    kw = {}
    if device == "cuda":
        total = torch.cuda.get_device_properties(0).multi_processor_count
        kw["quotas"] = args.quotas or [q for q in (16, 40, 64, 96, 120) if q < total] + [total]
        kw["device_name"] = tz.device_name(0)
    elif args.quotas:
        ap.error("--quotas: the CPU has no SM partitions")
    try:
        prof = mt.profile(modules, after, inputs, global_batch=gb, batches=batches,
                          device=device, autocast=torch.bfloat16 if device == "cuda" else None,
                          optimizer=tz.fused_adamw, warmup=args.warmup, reps=args.reps,
                          verbose=True, **kw)
    except ValueError as e:
        ap.error(str(e))
    with open(out, "w") as f:
        json.dump(prof, f, indent=1)
    print(f"profile written to {out} ({prof['device']['name']})")
    sms = prof["device"]["sm_count"]
    for m in prof["modules"]:
        for dp in sorted({s["dp"] for s in m["samples"]}):
            times = " ".join(f"{round(s['sm'] * sms)}:{s['time_ms']:.1f}"
                             for s in m["samples"] if s["dp"] == dp)
            print(f"  {m['name']:8} dp {dp}, SMs:ms  {times}")

    short = tz.short_name(prof["device"]["name"])
    if short is None or args.size != 1.0:
        print("not a zoo device at the zoo's size: nothing to calibrate against")
        return 0
    line = ["calibrate", "--profiles", out, "--model", args.model, "--device", short]
    binary = os.environ.get("MOSAIC_BIN") or shutil.which("mosaic")
    if not binary:
        print("the device model against these measurements: mosaic " + " ".join(line))
        return 0
    print("$ mosaic " + " ".join(line), flush=True)
    return subprocess.run([binary] + line).returncode


if __name__ == "__main__":
    sys.exit(main())
