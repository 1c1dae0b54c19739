"""Devices, interconnect levels, clusters, their meshes and presets."""

from symtensor.hardware.cluster import (
    GIB,
    MEMORY_HEADROOM,
    PRESETS,
    Cluster,
    Device,
    Level,
    cluster_from_dict,
    cluster_names,
    load_cluster,
    prime_factors,
)
from symtensor.hardware.mesh import Axis, Mesh, divisors

__all__ = ["GIB", "MEMORY_HEADROOM", "PRESETS", "Axis", "Cluster", "Device", "Level", "Mesh", "cluster_from_dict",
           "cluster_names", "divisors", "load_cluster", "prime_factors"]
