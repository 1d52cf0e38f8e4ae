"""Mosaic: plans the training of multimodal models by temporal-spatial GPU multiplexing.

The planner, the simulator and the interference fit are the Rust crates of this repository,
called through the native module ``mosaic._core`` (PyO3); ``mosaic.torch`` profiles your own
PyTorch modules (imported on first use: ``import mosaic`` never imports PyTorch).

    import mosaic
    profile = mosaic.Profile.zoo("ofasys", "h100x8")     # or Profile.from_dict / from_file
    plan = mosaic.plan(profile, gpus=8)
    print(plan)                                          # the stages, as `mosaic plan` prints
    print(plan.iteration_ms, plan.optimal)
    plan.write("plan.json")
    report = mosaic.simulate(plan, trace="trace.json", svg="plan.svg")
    rows = mosaic.compare(profile, gpus=8)               # Megatron-LM, DistMM, ... Mosaic
    coloc = mosaic.simulate_colocations("ofasys", "h100x8", count=200)
    fitted = mosaic.fit(profile, coloc)                  # e1, e2, e3 and accuracy

Every bad input raises ``mosaic.MosaicError`` (a ``ValueError``) with the message the
``mosaic`` command prints: the file (or the name given to a dict), the field such as
``modules[0].samples[0].sm``, and what was expected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._core import (
    Colocations,
    MosaicError,
    Plan,
    Profile,
    __version__,
    compare,
    fit,
    plan,
    simulate,
    simulate_colocations,
    zoo,
    zoo_clusters,
    zoo_devices,
    zoo_models,
)

if TYPE_CHECKING:  # for type checkers only: at run time `mosaic.torch` is imported lazily
    from . import torch as torch

__all__ = [
    "Colocations",
    "MosaicError",
    "Plan",
    "Profile",
    "__version__",
    "compare",
    "fit",
    "plan",
    "simulate",
    "simulate_colocations",
    "zoo",
    "zoo_clusters",
    "zoo_devices",
    "zoo_models",
]


def __getattr__(name: str) -> Any:
    """Imports ``mosaic.torch`` on first access (it imports PyTorch only when it measures)."""
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"torch"})
