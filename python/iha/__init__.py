"""IHA: Interleaved Head Attention, the C++ library's Python door (docs/python.md).

iha.torch holds the PyTorch module and functional core; iha.layout the sequence layout map.
The compiled part is iha._iha (pybind11).
"""
try:
    from ._build import CUDA as _CUDA_BUILD
except ImportError:  # a source tree without the build's generated file: assume the worst case
    _CUDA_BUILD = True

if _CUDA_BUILD:
    # A CUDA build of _iha links the CUDA toolkit's runtime and NCCL, libraries a CUDA build of
    # torch ships its own copies of (PyPI wheels: newer ones). The dynamic loader keeps one
    # library per name in a process, so whichever loads first serves both: loaded first, the
    # machine's NCCL would shadow torch's (torch then fails to import: "undefined symbol:
    # ncclCommResume"). Importing torch first makes torch's copies the process's, and the
    # library uses them (both speak the same stable C APIs). Without torch installed there is
    # nothing to shadow.
    import importlib as _importlib
    import importlib.util as _util

    if _util.find_spec("torch") is not None:
        try:
            _importlib.import_module("torch")  # not bound here: iha.torch is this package's module
        except Exception:  # noqa: BLE001 - a broken torch: iha.torch reports it when imported
            pass
    del _importlib, _util

from ._iha import LayerConfig, Error, ConfigError  # noqa: E402,F401

__all__ = ["LayerConfig", "Error", "ConfigError"]
