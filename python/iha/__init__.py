"""IHA: Interleaved Head Attention, the C++ library's Python door (docs/python.md).

iha.torch holds the PyTorch module and functional core; iha.layout the sequence layout map.
The compiled part is iha._iha (pybind11).
"""
from ._iha import LayerConfig, Error, ConfigError  # noqa: F401

__all__ = ["LayerConfig", "Error", "ConfigError"]
