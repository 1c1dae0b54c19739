"""Devices, interconnect levels, clusters and their presets."""

from symtensor.hardware.cluster import (PRESETS, Axis, Cluster, Device, Level, cluster_from_dict, cluster_names,
                                        load_cluster, prime_factors)

__all__ = ["PRESETS", "Axis", "Cluster", "Device", "Level", "cluster_from_dict", "cluster_names", "load_cluster",
           "prime_factors"]
