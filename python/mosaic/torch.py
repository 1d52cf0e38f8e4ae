"""Profile your own PyTorch modules for the Mosaic planner.

``mosaic.torch`` times each of a model's modules (plain ``torch.nn.Module`` s) on this machine's
GPU at several per-GPU batch sizes (standing for data-parallel degrees ``dp = global_batch /
batch``) and SM partitions (CUDA green contexts), and returns a ``mosaic-profiles/1`` dict that
``mosaic.Profile.from_dict`` reads and ``mosaic.plan`` plans::

    import mosaic, mosaic.torch
    prof = mosaic.torch.profile(
        {"vision": vit, "text": bert, "head": fusion},
        after={"head": ["vision", "text"]},
        inputs={"vision": lambda b: (torch.randn(b, 3, 224, 224),),
                "text": lambda b: (torch.randint(0, 30000, (b, 77)),),
                "head": lambda b: (torch.randn(b, 768), torch.randn(b, 512))},
        global_batch=64)
    print(mosaic.plan(mosaic.Profile.from_dict(prof), gpus=8))

What one sample is: one replica's training step (forward, backward, optimizer step) at per-GPU
batch ``global_batch // dp`` on one GPU, restricted to the partition's SMs, without the gradient
all-reduce a real ``dp``-way run adds; the median of ``reps`` steps after ``warmup`` warm-up
steps. The file's ``source`` says exactly how it was measured.

How (following ``shared/measurements/h100/measure.py``, which ran on a real H100):

* SM partitions are CUDA green contexts: ``torch.cuda.green_contexts`` where the installed
  PyTorch has ``GreenContext.Stream`` (and ``SMPartition.split`` for disjoint pairs), otherwise
  the CUDA driver API of ``cuda-bindings`` (``cuDevSmResourceSplitByCount``,
  ``cuGreenCtxCreate``, ``cuGreenCtxStreamCreate``) with the stream handed to PyTorch as an
  external stream. The whole GPU (quota 1.0) is an ordinary stream, no green context.
* Quotas are whole SM partitions of the device (Hopper: at least 8 SMs, multiples of 8, at most
  the 128 of 132 SMs a split hands out; Ampere: at least 4, multiples of 2); the rule goes into
  the profile's ``device.partition`` and every sample's ``sm`` is granted SMs / ``sm_count``.
* Times are CUDA events on the module's stream (falling back to the host clock around a stream
  synchronisation where events cannot be recorded there).
* Memory is ``torch.cuda.max_memory_allocated`` during the steps minus what was allocated before
  the module was copied to the GPU: parameters, gradients, optimizer state and activations.
* ``sm_util`` and ``bw_util`` come from NVML (``pynvml``, package ``nvidia-ml-py``),
  ``nvmlDeviceGetUtilizationRates`` polled every 10 ms over at least ``util_window_s`` of
  back-to-back steps. Read them for what they are: ``utilization.gpu`` is the fraction of time
  *a kernel was running* on the GPU, not SM occupancy (a kernel on 16 SMs counts as 100 %);
  ``utilization.memory`` is the fraction of time device memory was being read or written, the
  planner's bandwidth (interference) proxy. Without NVML, ``sm_util`` = 1.0 and ``bw_util`` =
  0.0 are written as placeholders and ``source`` says so.
* Pitfall measured on the H100: eager PyTorch launches from several Python threads serialise
  (one interpreter lock, one autograd worker per device), so eagerly launched modules that
  share a GPU barely overlap. ``graphs=True`` captures each module's step as a CUDA graph
  (``torch.cuda.graph``) and replays it: one launch per step, the host cost off the GPU's path.

On a machine without CUDA, ``profile_cpu`` (or ``profile(..., device="cpu")``) times the same
steps on the CPU at quota 1.0 only, labelled as CPU timings in ``source``, so that a script runs
end to end anywhere (the "GPUs" the planner then places modules on stand for ranks like this
CPU).

This module imports PyTorch only when a measuring function is called, so its pure helpers
(partition rounding, batch to dp, file assembly) work without it.
"""

from __future__ import annotations

import copy
import math
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

__all__ = [
    "profile",
    "profile_cpu",
    "colocations",
    "default_step",
    "granularity_for",
    "largest_within",
    "allowed_sms",
    "sms_for",
    "quota_grid",
    "default_quotas",
    "resolve_quotas",
    "partition_sms",
    "sm_fraction",
    "default_batches",
    "resolve_batches",
    "check_after",
    "build_profile",
    "build_colocations",
]

PROFILES_FORMAT = "mosaic-profiles/1"
COLOCATIONS_FORMAT = "mosaic-colocations/1"
#: How far a quota may lie from a whole number of SMs and still be read as one (the planner's rule).
SM_QUOTA_TOLERANCE = 1e-3
GIB = float(1 << 30)

# ------------------------------------------------------------------------------------------
# Pure helpers: no PyTorch needed. They mirror `mosaic_profile::partition` in the Rust crates.
# ------------------------------------------------------------------------------------------


def granularity_for(major: int) -> dict:
    """The SM partition rule of compute capability ``major``.x, as a profile's ``device.partition``.

    The CUDA driver's guideline, the same table as the planner's
    ``SmGranularity::for_compute_capability``: 6.x one SM; 7.x at least 2, multiples of 2; 8.x at
    least 4, multiples of 2; 9.0 and later at least 8, multiples of 8.
    """
    if major <= 6:
        m, s = 1, 1
    elif major == 7:
        m, s = 2, 2
    elif major == 8:
        m, s = 4, 2
    else:
        m, s = 8, 8
    return {"min_sms": m, "step_sms": s}


def largest_within(capacity: int, g: Mapping[str, int]) -> Optional[int]:
    """The most SMs an allowed partition of at most ``capacity`` SMs has (128 of an H100's 132), or None."""
    step = max(1, int(g["step_sms"]))
    top = capacity - capacity % step
    return top if top >= max(1, int(g["min_sms"])) else None


def allowed_sms(sms: int, g: Mapping[str, int]) -> bool:
    """Whether a green context of ``sms`` SMs is allowed by partition rule ``g``."""
    return sms >= int(g["min_sms"]) and sms % max(1, int(g["step_sms"])) == 0


def sms_for(quota: float, total: int, g: Mapping[str, int]) -> int:
    """SMs of a partition for ``quota`` of a ``total``-SM device.

    ``quota × total`` rounded to the nearest multiple of ``step_sms``, at least ``min_sms``, at most
    :func:`largest_within` ``(total)``; the planner's ``sms_for``. Raises ``ValueError`` for a quota
    outside (0, 1] or a device too small for a partition.
    """
    if not (isinstance(quota, (int, float)) and math.isfinite(quota) and 0.0 < quota <= 1.0):
        raise ValueError(f"an SM quota must lie in (0, 1], got {quota!r}")
    cap = largest_within(total, g)
    if cap is None:
        raise ValueError(f"a {total}-SM device holds no partition of at least {g['min_sms']} SMs")
    step = max(1, int(g["step_sms"]))
    # Round half away from zero like Rust's f64::round (Python's round() rounds half to even).
    n = int(math.floor(quota * total / step + 0.5)) * step
    return min(max(n, int(g["min_sms"])), cap)


def quota_grid(total: int, g: Mapping[str, int]) -> list:
    """Every SM count a module may hold on a ``total``-SM device, ascending: the partitions a split
    hands out (8, 16, …, 128 on an H100) and ``total`` itself (the whole GPU, no green context)."""
    step = max(1, int(g["step_sms"]))
    first = -(-max(1, int(g["min_sms"])) // step) * step
    top = largest_within(total, g)
    out = list(range(first, top + 1, step)) if top is not None else []
    if total > 0 and (not out or out[-1] != total):
        out.append(total)
    return out


def default_quotas(total: int, g: Mapping[str, int]) -> list:
    """The default sweep: about every eighth of the device as a partition, plus the whole GPU.

    On an H100 (132 SMs, 8/8): 16, 32, 48, 64, 80, 96, 112, 132.
    """
    out = sorted({sms_for(k / 8.0, total, g) for k in range(1, 8)} | {total})
    return out


def resolve_quotas(quotas: Optional[Iterable[Union[int, float]]], total: int,
                   g: Mapping[str, int]) -> list:
    """Turn a user's quotas into sorted, distinct SM counts of a ``total``-SM device.

    An ``int`` is an SM count and must be an allowed partition (see :func:`allowed_sms`) or
    ``total`` (the whole GPU); a ``float`` in (0, 1] is a fraction: 1.0 is the whole GPU, anything
    else is rounded to a partition by :func:`sms_for`. ``None`` gives :func:`default_quotas`.
    """
    if quotas is None:
        return default_quotas(total, g)
    out = set()
    cap = largest_within(total, g)
    for q in quotas:
        if isinstance(q, bool):
            raise ValueError(f"quota {q!r}: expected an SM count (int) or a fraction (float)")
        if isinstance(q, int):
            if q == total:
                out.add(total)
            elif cap is not None and allowed_sms(q, g) and q <= cap:
                out.add(q)
            else:
                raise ValueError(
                    f"quota {q} SMs: a green context on this {total}-SM device holds at least "
                    f"{g['min_sms']} SMs in multiples of {g['step_sms']}, at most {cap} "
                    f"(or all {total} SMs for the whole GPU); nearest allowed: "
                    f"{sms_for(min(1.0, max(q, 1) / total), total, g)}")
        elif isinstance(q, float):
            if not (math.isfinite(q) and 0.0 < q <= 1.0):
                raise ValueError(f"quota {q!r}: a fraction must lie in (0, 1]")
            out.add(total if q == 1.0 else sms_for(q, total, g))
        else:
            raise ValueError(f"quota {q!r}: expected an SM count (int) or a fraction (float)")
    if not out:
        raise ValueError("quotas: expected at least one quota")
    return sorted(out)


def partition_sms(quotas: Sequence[Union[int, float]], total: int, g: Mapping[str, int],
                  capacity: Optional[int] = None) -> list:
    """Disjoint SM counts for modules that run at the same time (the planner's ``partition_sms``).

    Each quota (a fraction, or an ``int`` SM count) becomes :func:`sms_for` SMs; while the set asks
    for more than a split hands out (:func:`largest_within` ``(capacity)``, default ``total``),
    the module furthest above its exact share gives back ``step_sms`` SMs. Raises ``ValueError``
    when the modules cannot fit.
    """
    capacity = total if capacity is None else capacity
    cap = largest_within(capacity, g)
    if cap is None:
        raise ValueError(f"{capacity} SMs hold no partition of at least {g['min_sms']} SMs")
    fr = []
    for q in quotas:
        if isinstance(q, bool) or not isinstance(q, (int, float)):
            raise ValueError(f"quota {q!r}: expected an SM count (int) or a fraction (float)")
        fr.append(q / total if isinstance(q, int) else float(q))
    sms = [min(sms_for(min(f, 1.0), total, g), cap) for f in fr]
    step = max(1, int(g["step_sms"]))
    while sum(sms) > cap:
        cands = [i for i in range(len(sms)) if sms[i] >= int(g["min_sms"]) + step]
        if not cands:
            raise ValueError(
                f"{len(sms)} modules at once need at least {len(sms) * int(g['min_sms'])} SMs; "
                f"a split of {capacity} hands out {cap}")
        best = cands[0]
        for i in cands[1:]:
            if sms[i] - fr[i] * total > sms[best] - fr[best] * total:
                best = i
        sms[best] -= step
    return sms


def sm_fraction(sms: int, total: int) -> float:
    """A sample's ``sm`` field: ``sms / total`` written to 6 decimals (16 of 132 → 0.121212)."""
    return round(sms / total, 6)


def default_batches(global_batch: int, max_dp: int = 8) -> list:
    """Per-GPU batches for dp 1, 2, 4, … up to ``max_dp`` that divide ``global_batch``."""
    out, d = [], 1
    while d <= max_dp:
        if global_batch % d == 0:
            out.append(global_batch // d)
        d *= 2
    return out


def resolve_batches(batches: Optional[Iterable[int]], global_batch: Optional[int]) -> list:
    """``[(per-GPU batch, dp)]`` in ascending dp: ``dp = global_batch // batch``.

    Every batch must divide ``global_batch`` (a dp-way run splits the global batch evenly); with
    ``global_batch`` None it is the largest batch (dp 1). Raises ``ValueError`` otherwise.
    """
    if batches is None:
        if global_batch is None:
            raise ValueError("give global_batch (and optionally batches, the per-GPU batch sizes)")
        batches = default_batches(int(global_batch))
    bs = [int(b) for b in batches]
    if not bs:
        raise ValueError("batches: expected at least one per-GPU batch size")
    if global_batch is None:
        global_batch = max(bs)
    if not (isinstance(global_batch, int) and global_batch >= 1):
        raise ValueError(f"global_batch must be a positive int, got {global_batch!r}")
    out = {}
    for b in bs:
        if b < 1 or global_batch % b != 0:
            raise ValueError(
                f"per-GPU batch {b} does not divide global_batch {global_batch}: dp = "
                f"global_batch / batch must be a whole number of replicas")
        dp = global_batch // b
        if dp > 65536:
            raise ValueError(f"per-GPU batch {b} gives dp {dp}, more than the planner's 65536 GPUs")
        out[dp] = b
    return [(out[dp], dp) for dp in sorted(out)]


def check_after(names: Sequence[str], after: Optional[Mapping[str, Sequence[str]]]) -> dict:
    """Each module's producers, as ``{name: [producers]}`` for every name; ``ValueError`` for an
    unknown or repeated name, a module after itself, or a cycle."""
    after = dict(after or {})
    known = set(names)
    for k in after:
        if k not in known:
            raise ValueError(f"after: unknown module {k!r} (modules: {', '.join(names)})")
    out = {}
    for n in names:
        deps = [str(a) for a in after.get(n, [])]
        for a in deps:
            if a not in known:
                raise ValueError(f"after[{n!r}]: unknown module {a!r}")
            if a == n:
                raise ValueError(f"after[{n!r}]: a module cannot come after itself")
        if len(set(deps)) != len(deps):
            raise ValueError(f"after[{n!r}]: a module is listed twice")
        out[n] = deps
    state = {}

    def visit(n, path):
        if state.get(n) == 2:
            return
        if state.get(n) == 1:
            raise ValueError("after: a cycle " + " -> ".join(path + [n]))
        state[n] = 1
        for a in out[n]:
            visit(a, path + [n])
        state[n] = 2

    for n in names:
        visit(n, [])
    return out


def build_profile(device: Mapping[str, Any], modules: Sequence[Mapping[str, Any]], source: str,
                  interference: Optional[Mapping[str, float]] = None) -> dict:
    """Assemble a ``mosaic-profiles/1`` dict from a device entry and ``[{name, after, samples,
    grad_gib?}]``; interference defaults to zero (fit it with ``mosaic.fit`` on colocations)."""
    inter = {"e1": 0.0, "e2": 0.0, "e3": 0.0}
    if interference:
        inter.update({k: float(v) for k, v in interference.items()})
    return {"format": PROFILES_FORMAT, "device": dict(device), "source": source,
            "modules": [dict(m) for m in modules], "interference": inter}


def build_colocations(device_name: str, samples: Sequence[Mapping[str, Any]], source: str) -> dict:
    """Assemble a ``mosaic-colocations/1`` dict: ``samples`` are ``{"modules": [{name, dp, sm,
    time_ms}, …]}``."""
    return {"format": COLOCATIONS_FORMAT, "device": device_name, "source": source,
            "samples": [dict(s) for s in samples]}


def _median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def _clip01(x: float) -> float:
    return float(min(1.0, max(0.0, x)))


# ------------------------------------------------------------------------------------------
# PyTorch side (imported lazily).
# ------------------------------------------------------------------------------------------


def _torch():
    try:
        import torch  # noqa: F401  (absolute: the real PyTorch, not this module)
    except ImportError as e:
        raise ImportError(
            f"mosaic.torch needs PyTorch to measure modules ({e}); install it: pip install torch"
        ) from e
    return torch


def _log(verbose: bool, msg: str) -> None:
    if verbose:
        print(f"[mosaic.torch] {msg}", file=sys.stderr, flush=True)


def _fit_batch(torch, x, b: int):
    """An example tensor resized to batch ``b`` along dimension 0 (cut, or repeated and cut)."""
    if x.dim() == 0:
        return x
    n = x.shape[0]
    if n == b:
        return x
    if n > b:
        return x[:b].clone()
    reps = (-(-b // n),) + (1,) * (x.dim() - 1)
    return x.repeat(*reps)[:b].contiguous()


def _make_inputs(torch, spec, b: int, dev) -> tuple:
    """A module's positional inputs at batch ``b`` on ``dev`` from a maker or example tensors."""
    if callable(spec) and not isinstance(spec, torch.Tensor):
        x = spec(b)
    else:
        x = spec
        if isinstance(x, torch.Tensor):
            x = _fit_batch(torch, x, b)
        elif isinstance(x, (tuple, list)):
            x = tuple(_fit_batch(torch, t, b) if isinstance(t, torch.Tensor) else t for t in x)
    if not isinstance(x, (tuple, list)):
        x = (x,)
    return tuple(t.to(dev) if isinstance(t, torch.Tensor) else t for t in x)


def _float_tensors(torch, out):
    if isinstance(out, torch.Tensor):
        if out.is_floating_point() or out.is_complex():
            yield out
    elif isinstance(out, Mapping):
        for v in out.values():
            yield from _float_tensors(torch, v)
    elif isinstance(out, (tuple, list)):
        for v in out:
            yield from _float_tensors(torch, v)


def default_step(module, inputs: tuple, optimizer, autocast=None, zero_grad: bool = True):
    """The default training step: forward, loss = Σ mean of the floating outputs (in fp32),
    backward, ``optimizer.step()``, ``optimizer.zero_grad(set_to_none=True)``.

    A module without trainable parameters (``optimizer`` None) runs forward only, under
    ``torch.no_grad``. ``autocast`` is a dtype (``torch.bfloat16``) to run the forward under
    ``torch.autocast``. ``zero_grad=False`` leaves the gradients in place (what a CUDA-graph
    capture wants: its backward writes them afresh at every replay). A ``step=`` of your own
    is called as ``step(module, inputs, optimizer)``.
    """
    torch = _torch()
    dev_type = next((t.device.type for t in inputs if isinstance(t, torch.Tensor)), "cpu")
    if optimizer is None:
        with torch.no_grad():
            if autocast is not None:
                with torch.autocast(dev_type, dtype=autocast):
                    return module(*inputs)
            return module(*inputs)
    if autocast is not None:
        with torch.autocast(dev_type, dtype=autocast):
            out = module(*inputs)
    else:
        out = module(*inputs)
    parts = [t.float().mean() for t in _float_tensors(torch, out) if t.requires_grad]
    if not parts:
        raise ValueError("the module's outputs have no floating tensor that requires grad: give "
                         "a step=... of your own")
    loss = parts[0]
    for p in parts[1:]:
        loss = loss + p
    loss.backward()
    optimizer.step()
    if zero_grad:
        optimizer.zero_grad(set_to_none=True)
    return loss


class _Runner:
    """One module's copy, optimizer and inputs at one per-GPU batch, and its step (eager or graph)."""

    def __init__(self, torch, module, spec, batch, dev, step, optimizer, autocast, graphs):
        self.torch = torch
        self.net = copy.deepcopy(module).to(dev)
        self.net.train()
        self.inputs = _make_inputs(torch, spec, batch, dev)
        params = [p for p in self.net.parameters() if p.requires_grad]
        self.params = params
        if not params:
            self.opt = None
        elif optimizer is not None:
            self.opt = optimizer(params)
        else:
            kw = {"lr": 1e-4}
            if graphs:
                kw["capturable"] = True
            self.opt = torch.optim.AdamW(params, **kw)
        self.user_step = step
        self.autocast = autocast
        self.graph = None

    def eager(self, zero_grad: bool = True):
        if self.user_step is not None:
            return self.user_step(self.net, self.inputs, self.opt)
        return default_step(self.net, self.inputs, self.opt, self.autocast, zero_grad)

    def capture(self, stream, warmup: int, name: str):
        """Warm up on ``stream`` and capture one step there as a CUDA graph (replayed by run())."""
        torch = self.torch
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(max(2, warmup)):
                self.eager()
        stream.synchronize()
        if self.opt is not None:
            self.opt.zero_grad(set_to_none=True)
        # As PyTorch's whole-network capture: gradients set to None before the capture, so the
        # captured backward allocates them in the graph's pool and every replay rewrites them.
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(g, stream=stream):
                self.eager(zero_grad=False)
        except Exception as e:
            raise RuntimeError(
                f"graphs=True: capturing module {name!r}'s step as a CUDA graph failed ({e}); a "
                f"step that synchronises with the host (.item(), data-dependent shapes, CPU "
                f"tensors) cannot be captured, and an optimizer of your own must be made with "
                f"capturable=True: use graphs=False for such a module") from e
        self.graph = g

    def run(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.eager()

    def drop_graph(self):
        self.graph = None

    def grad_gib(self) -> float:
        return sum(p.numel() * p.element_size() for p in self.params) / GIB

    def free(self):
        self.graph = None
        self.net = self.opt = self.inputs = self.params = None


# ---------------------------------------------------------------- green contexts


class _Slot:
    """A stream on ``sms`` SMs (a green context's, or an ordinary one for the whole GPU)."""

    def __init__(self, stream, sms, keep=(), destroy=None):
        self.stream, self.sms, self._keep, self._destroy = stream, sms, list(keep), destroy

    def close(self):
        self.stream = None
        if self._destroy is not None:
            d, self._destroy = self._destroy, None
            d()
        self._keep = []


class _GreenContexts:
    """Creates green-context slots through PyTorch's API where it has one, else cuda-bindings."""

    def __init__(self, torch, dev, backend: str):
        self.torch, self.dev, self.index = torch, dev, dev.index or 0
        if backend not in ("auto", "torch", "driver"):
            raise ValueError(f"backend must be 'auto', 'torch' or 'driver', got {backend!r}")
        self.gcm = None
        try:
            import torch.cuda.green_contexts as gcm
            if hasattr(gcm, "GreenContext") and hasattr(gcm.GreenContext, "Stream"):
                self.gcm = gcm
        except Exception:
            pass
        self.cu = None
        self.driver_error = None
        try:
            try:
                from cuda.bindings import driver as cu
            except ImportError:
                from cuda import cuda as cu  # cuda-python before 12.6's layout
            self.cu = cu
        except Exception as e:  # noqa: BLE001
            self.driver_error = e
        if backend == "torch" and self.gcm is None:
            raise RuntimeError("backend='torch': this PyTorch has no torch.cuda.green_contexts."
                               "GreenContext.Stream; use backend='driver' (pip install cuda-bindings)")
        if backend == "driver" and self.cu is None:
            raise RuntimeError(f"backend='driver' needs cuda-bindings (pip install cuda-bindings): "
                               f"{self.driver_error}")
        self.backend = backend if backend != "auto" else ("torch" if self.gcm is not None else "driver")

    def describe(self) -> str:
        if self.backend == "torch":
            return "green contexts of torch.cuda.green_contexts"
        return "green contexts of the CUDA driver API (cuda-bindings)"

    def slots(self, counts: Sequence[int]) -> list:
        """Disjoint green-context slots of the given SM counts (one slot needs no disjointness)."""
        if self.backend == "torch":
            try:
                return self._torch_slots(counts)
            except Exception:
                if self.cu is None or len(counts) == 1:
                    raise
                # e.g. SMPartition.split needs driver 13.1+: the driver path splits one at a time.
        if self.cu is None:
            raise RuntimeError(f"CUDA green contexts need cuda-bindings (pip install "
                               f"cuda-bindings) or a PyTorch with torch.cuda.green_contexts: "
                               f"{self.driver_error}")
        return self._driver_slots(counts)

    def _torch_slots(self, counts):
        gcm, idx = self.gcm, self.index
        if len(counts) == 1:
            ctxs = [gcm.GreenContext.create(num_sms=int(counts[0]), device_id=idx)]
        else:
            if not hasattr(gcm, "SMPartition"):
                raise RuntimeError("torch.cuda.green_contexts has no SMPartition.split")
            parts, _rest = gcm.SMPartition.from_device(idx).split(num_sms=[int(c) for c in counts])
            ctxs = [gcm.GreenContext(sm_partition=p) for p in parts]
        out = []
        for c, want in zip(ctxs, counts):
            sms = int(getattr(c, "sm_count", want))
            out.append(_Slot(c.Stream(), sms, keep=[c]))
        return out

    def _driver_slots(self, counts):
        """measure.py's ``Partition``: split one partition off, make a green context of the
        remainder, split the next off that (a split's output cannot be split again)."""
        cu, torch = self.cu, self.torch

        def ck(r):
            err = r[0]
            if err != cu.CUresult.CUDA_SUCCESS:
                raise RuntimeError(f"CUDA driver error {err}")
            rest = r[1:]
            return rest[0] if len(rest) == 1 else rest

        torch.cuda.synchronize(self.dev)
        cudev = ck(cu.cuDeviceGet(self.index))
        sm_t = cu.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM
        flags = cu.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM
        res = ck(cu.cuDeviceGetDevResource(cudev, sm_t))
        ctxs, raws, got = [], [], []
        try:
            for i, n in enumerate(counts):
                groups, _nb, rem = ck(cu.cuDevSmResourceSplitByCount(1, res, 0, int(n)))
                grp = groups[0]
                desc = ck(cu.cuDevResourceGenerateDesc([grp], 1))
                gctx = ck(cu.cuGreenCtxCreate(desc, cudev, flags))
                ctxs.append(gctx)
                st = ck(cu.cuGreenCtxStreamCreate(gctx, cu.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
                raws.append(st)
                got.append(int(grp.sm.smCount))
                if i + 1 < len(counts):
                    rdesc = ck(cu.cuDevResourceGenerateDesc([rem], 1))
                    rctx = ck(cu.cuGreenCtxCreate(rdesc, cudev, flags))
                    ctxs.append(rctx)
                    res = ck(cu.cuGreenCtxGetDevResource(rctx, sm_t))
        except Exception:
            for s in raws:
                cu.cuStreamDestroy(s)
            for c in ctxs:
                cu.cuGreenCtxDestroy(c)
            raise
        if hasattr(torch.cuda, "get_stream_from_external"):
            streams = [torch.cuda.get_stream_from_external(int(s), self.dev) for s in raws]
        else:
            streams = [torch.cuda.ExternalStream(int(s), device=self.dev) for s in raws]
        shared = {"left": len(raws)}

        def destroy_all():
            shared["left"] -= 1
            if shared["left"] > 0:
                return
            torch.cuda.synchronize(self.dev)
            for s in raws:
                cu.cuStreamDestroy(s)
            for c in ctxs:
                cu.cuGreenCtxDestroy(c)

        return [_Slot(s, n, destroy=destroy_all) for s, n in zip(streams, got)]


# ---------------------------------------------------------------- timing and utilisation


class _Timer:
    """Times steps on a stream with CUDA events, or the host clock where events fail there."""

    def __init__(self, torch):
        self.torch = torch
        self.events_ok = True
        self.fell_back = False

    def once(self, fn, stream) -> float:
        torch = self.torch
        if self.events_ok:
            try:
                s = torch.cuda.Event(enable_timing=True)
                e = torch.cuda.Event(enable_timing=True)
                s.record(stream)
            except Exception:
                self.events_ok, self.fell_back = False, True
            else:
                with torch.cuda.stream(stream):
                    fn()
                e.record(stream)
                e.synchronize()
                return float(s.elapsed_time(e))
        stream.synchronize()
        t = time.perf_counter()
        with torch.cuda.stream(stream):
            fn()
        stream.synchronize()
        return (time.perf_counter() - t) * 1e3


class _Nvml:
    """NVML utilisation of one GPU, polled on a thread while steps run."""

    def __init__(self, torch, dev):
        self.handle, self.error, self.nv = None, None, None
        try:
            import pynvml as nv
            nv.nvmlInit()
            props = torch.cuda.get_device_properties(dev)
            h = None
            uuid = getattr(props, "uuid", None)
            if uuid is not None:
                try:
                    s = str(uuid)
                    h = nv.nvmlDeviceGetHandleByUUID(s if s.startswith("GPU-") else "GPU-" + s)
                except Exception:
                    h = None
            if h is None:
                if os.environ.get("CUDA_VISIBLE_DEVICES"):
                    raise RuntimeError("cannot map the CUDA device to an NVML device under "
                                       "CUDA_VISIBLE_DEVICES without its UUID")
                h = nv.nvmlDeviceGetHandleByIndex(dev.index or 0)
            nv.nvmlDeviceGetUtilizationRates(h)
            self.nv, self.handle = nv, h
        except Exception as e:  # noqa: BLE001
            self.error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__

    @property
    def ok(self) -> bool:
        return self.handle is not None

    def sample(self, run_until: Callable[[], bool], period_s: float = 0.01):
        """Poll while ``run_until()`` runs steps in the caller; returns (sm_util, bw_util) means."""
        if not self.ok:
            return None
        gpu, mem, stop = [], [], threading.Event()

        def poll():
            while not stop.is_set():
                try:
                    u = self.nv.nvmlDeviceGetUtilizationRates(self.handle)
                    gpu.append(u.gpu / 100.0)
                    mem.append(u.memory / 100.0)
                except Exception:
                    pass
                stop.wait(period_s)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        try:
            run_until()
        finally:
            stop.set()
            th.join()
        if not gpu:
            return None
        return _clip01(sum(gpu) / len(gpu)), _clip01(sum(mem) / len(mem))


def _measure_at(torch, runner, slot, timer, nvml, warmup, reps, util_window_s, graphs, name):
    """The median step time (ms) on ``slot`` and NVML's (sm_util, bw_util) or None."""
    stream = slot.stream
    torch.cuda.synchronize()  # inputs and weights were made on another stream
    if graphs:
        runner.capture(stream, warmup, name)
    else:
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                runner.run()
        stream.synchronize()
    times = []
    util = None
    sampling = nvml is not None and nvml.ok
    # NVML averages over 1/6 s to 1 s: keep stepping (untimed) until its window is filled.
    window = util_window_s if sampling else 0.0

    def timed_loop():
        t0 = time.perf_counter()
        for _ in range(reps):
            times.append(timer.once(runner.run, stream))
        while time.perf_counter() - t0 < window:
            with torch.cuda.stream(stream):
                runner.run()
            stream.synchronize()

    if sampling:
        util = nvml.sample(timed_loop)
    else:
        timed_loop()
    runner.drop_graph()
    return _median(times), util


def _cuda_device(torch, device, who="mosaic.torch.profile"):
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device {device!r}: expected 'cuda', 'cuda:N' or 'cpu'")
    if not torch.cuda.is_available():
        why = (f"this PyTorch ({torch.__version__}) was built without CUDA"
               if torch.version.cuda is None else
               f"torch.cuda.is_available() is False (PyTorch {torch.__version__}, CUDA "
               f"{torch.version.cuda}: no NVIDIA driver or GPU visible)")
        hint = ("For CPU timings (quota 1.0 only), pass device=\"cpu\" or call "
                "mosaic.torch.profile_cpu(...)" if who == "mosaic.torch.profile" else
                "Colocations share a GPU's SMs: they cannot be measured without one")
        raise RuntimeError(f"{who} needs a CUDA GPU: {why}. {hint}")
    if dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.init()
    torch.zeros(1, device=dev)  # makes the primary context current, as green contexts need
    return dev


def _check_inputs(names, inputs):
    if inputs is None:
        raise ValueError("inputs: give each module's inputs (a function of the per-GPU batch, "
                         "or example tensors)")
    missing = [n for n in names if n not in inputs]
    if missing:
        raise ValueError(f"inputs: no inputs for module(s) {', '.join(map(repr, missing))}")
    extra = [k for k in inputs if k not in set(names)]
    if extra:
        raise ValueError(f"inputs: unknown module(s) {', '.join(map(repr, extra))}")


def _check_counts(warmup, reps):
    if not (isinstance(warmup, int) and 0 <= warmup <= 10000):
        raise ValueError(f"warmup must be an int from 0 to 10000, got {warmup!r}")
    if not (isinstance(reps, int) and 1 <= reps <= 100000):
        raise ValueError(f"reps must be an int from 1 to 100000, got {reps!r}")


def profile(modules: Mapping[str, Any],
            after: Optional[Mapping[str, Sequence[str]]] = None,
            inputs: Optional[Mapping[str, Any]] = None,
            *,
            global_batch: Optional[int] = None,
            batches: Optional[Sequence[int]] = None,
            quotas: Optional[Sequence[Union[int, float]]] = None,
            step: Optional[Callable] = None,
            optimizer: Optional[Callable] = None,
            autocast: Any = None,
            device: str = "cuda",
            warmup: int = 2,
            reps: int = 5,
            graphs: bool = False,
            backend: str = "auto",
            util_window_s: float = 0.5,
            device_name: Optional[str] = None,
            memory_gib: Optional[float] = None,
            interference: Optional[Mapping[str, float]] = None,
            verbose: bool = False) -> dict:
    """Measure each module's training step and return a ``mosaic-profiles/1`` dict.

    Args:
        modules: ``{name: nn.Module}`` in any order; each is deep-copied to the device (yours is
            left untouched) and trained from its current weights.
        after: ``{name: [producer names]}``, the DAG (modules not listed have no producers).
        inputs: ``{name: inputs}`` for every module: a function of the per-GPU batch returning a
            tensor or a tuple of positional arguments (``lambda b: (torch.randn(b, 3, 224, 224),)``),
            or example tensors (or a tuple of them) whose first dimension is cut or repeated to
            the batch. A downstream module gets synthetic stand-ins for its producers' outputs.
        global_batch: the global batch; ``dp = global_batch // batch``.
        batches: per-GPU batch sizes (default: those of dp 1, 2, 4, 8 dividing ``global_batch``).
        quotas: SM counts (ints) or fractions (floats) to sweep (default: about every eighth of
            the GPU plus the whole GPU); rounded to the device's partition rule.
        step: ``step(module, inputs_tuple, optimizer)`` running one training step (default:
            :func:`default_step`); ``optimizer``: ``f(params) -> torch.optim.Optimizer``
            (default AdamW lr 1e-4, ``capturable=True`` with ``graphs``); ``autocast``: a dtype
            for the default step's forward.
        device: ``"cuda"`` / ``"cuda:N"``, ``"cpu"`` (:func:`profile_cpu`), or ``"auto"``
            (``"cuda"`` where ``torch.cuda.is_available()``, else ``"cpu"``).
        warmup, reps: warm-up steps, then timed steps (the sample is their median) per point.
        graphs: capture each module's step as a CUDA graph per point and time its replays.
        backend: green contexts from ``"torch"`` (torch.cuda.green_contexts), ``"driver"``
            (cuda-bindings) or ``"auto"`` (torch's where it has ``GreenContext.Stream``).
        util_window_s: NVML polls over at least this long of back-to-back steps per point.
        device_name, memory_gib: override the device entry (e.g. the name your other files use).
        interference: ``{"e1", "e2", "e3"}`` to write (default zeros).
        verbose: print progress to stderr.

    Raises:
        RuntimeError: ``device`` is CUDA and no CUDA GPU is usable (the message says how to get
            CPU timings instead); ``ValueError`` for inconsistent arguments.
    """
    torch = _torch()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    names = [str(n) for n in modules]
    deps = check_after(names, after)
    _check_inputs(names, inputs)
    _check_counts(warmup, reps)
    pairs = resolve_batches(batches, global_batch)
    gb = global_batch if global_batch is not None else max(b for b, _ in pairs)
    if device == "cpu" or (isinstance(device, str) and device.startswith("cpu")) or (
            not isinstance(device, str) and getattr(device, "type", None) == "cpu"):
        if quotas is not None and any(float(q) != 1.0 for q in quotas):
            raise ValueError("device='cpu' times at quota 1.0 only (a CPU has no SM partitions); "
                             "leave quotas unset")
        if graphs:
            raise ValueError("graphs=True needs a CUDA GPU")
        return _profile_cpu(torch, modules, names, deps, inputs, pairs, gb, step, optimizer,
                            autocast, warmup, reps, device_name, memory_gib, interference,
                            verbose)
    if not (isinstance(util_window_s, (int, float)) and 0 <= util_window_s <= 60):
        raise ValueError(f"util_window_s must lie in [0, 60], got {util_window_s!r}")
    dev = _cuda_device(torch, device)
    props = torch.cuda.get_device_properties(dev)
    total = int(props.multi_processor_count)
    g = granularity_for(int(props.major))
    counts = resolve_quotas(quotas, total, g)
    gcs = _GreenContexts(torch, dev, backend) if any(c != total for c in counts) else None
    # One slot per quota, pooled for the whole run (measure.py keeps its pools the same way).
    whole = _Slot(torch.cuda.Stream(dev), total)
    pool = {}
    try:
        for c in counts:
            if c == total:
                pool[c] = whole
            else:
                s = gcs.slots([c])[0]
                pool[c] = s
                if s.sms != c:
                    _log(verbose, f"asked {c} SMs, the driver granted {s.sms}")
        nvml = _Nvml(torch, dev)
        timer = _Timer(torch)
        mods = []
        for name in names:
            samples, grad = [], None
            for b, dp in pairs:
                torch.cuda.synchronize(dev)
                torch.cuda.empty_cache()
                base = torch.cuda.memory_allocated(dev)
                r = _Runner(torch, modules[name], inputs[name], b, dev, step, optimizer, autocast,
                            graphs)
                grad = r.grad_gib()
                seen = set()
                for c in counts:
                    slot = pool[c]
                    if slot.sms in seen:
                        continue  # two asks the driver granted alike: one sample
                    seen.add(slot.sms)
                    torch.cuda.synchronize(dev)
                    torch.cuda.reset_peak_memory_stats(dev)
                    ms, util = _measure_at(torch, r, slot, timer, nvml, warmup, reps,
                                           util_window_s, graphs, name)
                    peak = torch.cuda.max_memory_allocated(dev)
                    su, bu = util if util is not None else (1.0, 0.0)
                    samples.append({"dp": dp, "sm": sm_fraction(slot.sms, total),
                                    "time_ms": max(round(ms, 4), 1e-4),
                                    "mem_gib": round(max(0, peak - base) / GIB, 6),
                                    "sm_util": round(su, 4), "bw_util": round(bu, 4)})
                    _log(verbose, f"{name} batch {b} (dp {dp}) on {slot.sms}/{total} SMs: "
                                  f"{ms:.3f} ms")
                r.free()
                del r
            entry = {"name": name, "after": deps[name], "samples": samples}
            if grad is not None:
                entry["grad_gib"] = round(grad, 6)
            mods.append(entry)
    finally:
        try:
            torch.cuda.synchronize(dev)
        finally:
            for s in pool.values():
                if s is not whole:
                    s.close()
    name = device_name or props.name
    dev_entry = {"name": name, "sm_count": total,
                 "memory_gib": float(memory_gib) if memory_gib is not None else
                 round(props.total_memory / GIB, 3), "partition": g}
    src = (f"mosaic.torch.profile: measured on one {props.name} (compute capability "
           f"{props.major}.{props.minor}, {total} SMs) with PyTorch {torch.__version__}"
           f"{', ' + gcs.describe() if gcs else ''} (whole GPU: an ordinary stream); a sample "
           f"is one replica's training step (forward, backward, optimizer) at per-GPU batch "
           f"{gb}/dp on one GPU, without the gradient all-reduce; "
           f"{'CUDA-graph replays' if graphs else 'eager launches'}, median of {reps} after "
           f"{warmup} warm-up, timed by "
           f"{'the host clock around a stream synchronisation' if timer.fell_back else 'CUDA events'}"
           f"; mem_gib: torch.cuda.max_memory_allocated minus memory before the module; ")
    if nvml.ok:
        src += (f"sm_util: NVML utilization.gpu (time a kernel was running, not SM occupancy), "
                f"bw_util: NVML utilization.memory (time device memory was read or written), "
                f"polled every 10 ms over at least {util_window_s} s of back-to-back steps")
    else:
        src += (f"NVML unavailable ({nvml.error}): sm_util 1.0 and bw_util 0.0 are placeholders, "
                f"not measurements")
    return build_profile(dev_entry, mods, src, interference)


def profile_cpu(modules: Mapping[str, Any],
                after: Optional[Mapping[str, Sequence[str]]] = None,
                inputs: Optional[Mapping[str, Any]] = None,
                **kwargs) -> dict:
    """:func:`profile` on the CPU: the same steps timed by the host clock at quota 1.0 only.

    Samples have ``sm`` = 1.0; the device entry describes this CPU (``sm_count`` = PyTorch's
    intra-op threads, ``memory_gib`` = host memory) with no ``partition``; ``source`` says these
    are CPU timings. ``mem_gib`` is an estimate (parameters, gradients, optimizer state, inputs
    and the tensors autograd saved), ``sm_util`` is the process's CPU time over wall time ×
    threads, and ``bw_util`` is 0.0 (a CPU has no counter read here). Takes :func:`profile`'s
    keyword arguments except the GPU-only ones.
    """
    kwargs["device"] = "cpu"
    return profile(modules, after, inputs, **kwargs)


def _saved_bytes(torch, runner) -> int:
    """Bytes of the tensors autograd saves during one step, parameters and inputs excluded."""
    own = {p.untyped_storage().data_ptr() for p in runner.net.parameters()}
    own |= {t.untyped_storage().data_ptr() for t in runner.inputs if isinstance(t, torch.Tensor)}
    seen = {}

    def pack(t):
        try:
            st = t.untyped_storage()
            p = st.data_ptr()
            if p not in own:
                seen[p] = st.nbytes()
        except Exception:
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        runner.run()
    return sum(seen.values())


def _state_bytes(torch, runner) -> int:
    n = sum(p.numel() * p.element_size() for p in runner.net.parameters())
    n += sum(p.numel() * p.element_size() for p in runner.params)  # gradients
    n += sum(t.numel() * t.element_size() for t in runner.inputs if isinstance(t, torch.Tensor))
    if runner.opt is not None:
        for st in runner.opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    n += v.numel() * v.element_size()
    return n


def _host_memory_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    except (ValueError, OSError, AttributeError):
        return 16.0


def _profile_cpu(torch, modules, names, deps, inputs, pairs, gb, step, optimizer, autocast,
                 warmup, reps, device_name, memory_gib, interference, verbose):
    dev = torch.device("cpu")
    threads = int(torch.get_num_threads())
    mods = []
    for name in names:
        samples, grad = [], None
        for b, dp in pairs:
            r = _Runner(torch, modules[name], inputs[name], b, dev, step, optimizer, autocast,
                        False)
            grad = r.grad_gib()
            for _ in range(warmup):
                r.run()
            saved = _saved_bytes(torch, r) if r.opt is not None else 0
            times = []
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(reps):
                t = time.perf_counter()
                r.run()
                times.append((time.perf_counter() - t) * 1e3)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            util = _clip01(cpu / (wall * threads)) if wall > 0 else 1.0
            ms = max(_median(times), 1e-4)
            mem = (_state_bytes(torch, r) + saved) / GIB
            samples.append({"dp": dp, "sm": 1.0, "time_ms": round(ms, 4),
                            "mem_gib": round(mem, 6), "sm_util": round(util, 4), "bw_util": 0.0})
            _log(verbose, f"{name} batch {b} (dp {dp}) on the CPU: {ms:.3f} ms")
            r.free()
        entry = {"name": name, "after": deps[name], "samples": samples}
        if grad is not None:
            entry["grad_gib"] = round(grad, 6)
        mods.append(entry)
    cpu_name = platform.processor() or platform.machine() or "CPU"
    dev_entry = {"name": device_name or f"CPU {cpu_name} ({threads} threads)",
                 "sm_count": max(1, threads),
                 "memory_gib": float(memory_gib) if memory_gib is not None else
                 round(_host_memory_gib(), 3)}
    src = (f"mosaic.torch.profile_cpu: CPU timings, not GPU ones: measured on this machine's CPU "
           f"({cpu_name}, {threads} PyTorch threads) with PyTorch {torch.__version__}, at quota "
           f"1.0 only (no SM partitions); a sample is one replica's training step (forward, "
           f"backward, optimizer) at per-GPU batch {gb}/dp, without the gradient all-reduce, so "
           f"the planner's GPUs stand for ranks like this CPU; median of {reps} after {warmup} "
           f"warm-up by the host clock; mem_gib estimated (parameters, gradients, optimizer "
           f"state, inputs, tensors saved by autograd); sm_util: process CPU time / (wall time x "
           f"threads); bw_util: 0.0, not measured")
    return build_profile(dev_entry, mods, src, interference)


def colocations(modules: Mapping[str, Any],
                inputs: Mapping[str, Any],
                *,
                pairs: Optional[Sequence[Sequence[str]]] = None,
                splits: Optional[Sequence[Sequence[Union[int, float]]]] = None,
                batch: Optional[int] = None,
                global_batch: Optional[int] = None,
                step: Optional[Callable] = None,
                optimizer: Optional[Callable] = None,
                autocast: Any = None,
                device: str = "cuda",
                warmup: int = 2,
                reps: int = 5,
                graphs: bool = False,
                backend: str = "auto",
                device_name: Optional[str] = None,
                details: bool = False,
                verbose: bool = False):
    """Measure pairs of modules sharing the GPU on disjoint green contexts; ``mosaic-colocations/1``.

    For every pair (default: all pairs of ``modules``) and every split (default: 1/4 + 3/4,
    1/2 + 1/2, 3/4 + 1/4; each side an SM count or a fraction, made disjoint and whole partitions
    by :func:`partition_sms`), each module first runs alone on its green context, then both run
    at once, each launched from its own thread after a barrier; a sample records each module's
    median time together. Both modules run at per-GPU batch ``batch`` (default
    ``global_batch``), so ``dp = global_batch // batch``. ``graphs=True`` replays captured CUDA
    graphs (eager launches from two Python threads largely serialise).

    Returns the dict, or with ``details=True`` ``(dict, rows)`` where each row has ``name``,
    ``partner``, ``sms``, ``alone_ms``, ``together_ms``, ``slowdown`` and ``stage_ms`` (the wall
    time of both together). Raises ``RuntimeError`` without a CUDA GPU.
    """
    torch = _torch()
    names = [str(n) for n in modules]
    _check_inputs(names, inputs)
    _check_counts(warmup, reps)
    if global_batch is None and batch is None:
        raise ValueError("give global_batch (and optionally batch, the per-GPU batch)")
    gb = int(global_batch if global_batch is not None else batch)
    [(b, dp)] = resolve_batches([batch if batch is not None else gb], gb)
    if pairs is None:
        pairs = [(names[i], names[j]) for i in range(len(names)) for j in range(i + 1, len(names))]
    pairs = [tuple(p) for p in pairs]
    for p in pairs:
        if len(p) != 2 or p[0] == p[1] or any(x not in modules for x in p):
            raise ValueError(f"pairs: {p!r} is not two distinct module names")
    if not pairs:
        raise ValueError("colocations need at least two modules")
    if splits is None:
        splits = [(0.25, 0.75), (0.5, 0.5), (0.75, 0.25)]
    dev_s = device if isinstance(device, str) else str(device)
    if dev_s == "auto":
        device = dev_s = "cuda"
    if dev_s.startswith("cpu"):
        raise RuntimeError("mosaic.torch.colocations needs a CUDA GPU: a CPU has no SM "
                           "partitions to share")
    dev = _cuda_device(torch, device, "mosaic.torch.colocations")
    props = torch.cuda.get_device_properties(dev)
    total = int(props.multi_processor_count)
    g = granularity_for(int(props.major))
    counts = [partition_sms(list(s), total, g) for s in splits]
    gcs = _GreenContexts(torch, dev, backend)
    timer = _Timer(torch)
    samples, rows = [], []
    for a, c in pairs:
        ra = _Runner(torch, modules[a], inputs[a], b, dev, step, optimizer, autocast, graphs)
        rc = _Runner(torch, modules[c], inputs[c], b, dev, step, optimizer, autocast, graphs)
        try:
            for cnt in counts:
                slots = gcs.slots(cnt)
                try:
                    run = [ra, rc]
                    alone = []
                    for r, s, nm in zip(run, slots, (a, c)):
                        ms, _ = _measure_at(torch, r, s, timer, None, warmup, reps, 0.0, graphs, nm)
                        alone.append(ms)
                    if graphs:
                        for r, s, nm in zip(run, slots, (a, c)):
                            r.capture(s.stream, warmup, nm)
                    per, stage = _together(torch, dev, run, [s.stream for s in slots], timer,
                                           warmup, reps)
                    for r in run:
                        r.drop_graph()
                    entry = []
                    for nm, other, s, t_alone, t_tog in zip((a, c), (c, a), slots, alone, per):
                        entry.append({"name": nm, "dp": dp, "sm": sm_fraction(s.sms, total),
                                      "time_ms": max(round(t_tog, 4), 1e-4)})
                        rows.append({"name": nm, "partner": other, "sms": s.sms, "dp": dp,
                                     "alone_ms": t_alone, "together_ms": t_tog,
                                     "slowdown": t_tog / t_alone - 1.0, "stage_ms": stage})
                    samples.append({"modules": entry})
                    _log(verbose, f"{a}@{slots[0].sms} + {c}@{slots[1].sms} SMs: alone "
                                  f"{alone[0]:.2f} / {alone[1]:.2f} ms, together {per[0]:.2f} / "
                                  f"{per[1]:.2f} ms (stage {stage:.2f} ms)")
                finally:
                    for s in slots:
                        s.close()
        finally:
            ra.free()
            rc.free()
            torch.cuda.empty_cache()
    src = (f"mosaic.torch.colocations: measured on one {props.name} ({total} SMs) with PyTorch "
           f"{torch.__version__}, pairs of modules on disjoint {gcs.describe()}, each launched "
           f"from its own Python thread after a barrier "
           f"({'CUDA-graph replays' if graphs else 'eager launches, which largely serialise across threads'}); "
           f"per-GPU batch {b} (dp {dp}), median of {reps} after {warmup} warm-up")
    out = build_colocations(device_name or props.name, samples, src)
    return (out, rows) if details else out


def _together(torch, dev, runners, streams, timer, warmup, reps):
    """Runs ``runners`` at once, one thread each on its stream; per-runner median ms and the
    median wall time of the whole set."""
    k = len(runners)
    per = [[] for _ in range(k)]
    stage = []
    errors = []
    for it in range(warmup + reps):
        bar = threading.Barrier(k + 1)
        done = [0.0] * k

        def work(i):
            try:
                with torch.cuda.device(dev):
                    bar.wait()
                    done[i] = timer.once(runners[i].run, streams[i])
            except Exception as e:  # noqa: BLE001
                errors.append(e)
                try:
                    bar.abort()
                except Exception:
                    pass

        th = [threading.Thread(target=work, args=(i,)) for i in range(k)]
        for x in th:
            x.start()
        try:
            bar.wait()
        except threading.BrokenBarrierError:
            pass
        t = time.perf_counter()
        for x in th:
            x.join()
        s = (time.perf_counter() - t) * 1e3
        if errors:
            raise errors[0]
        if it >= warmup:
            for i in range(k):
                per[i].append(done[i])
            stage.append(s)
    return [_median(p) for p in per], _median(stage)
