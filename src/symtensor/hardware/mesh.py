"""The device mesh: named, prime-sized axes, each on one level of the cluster, outermost first.

Like ``jax.sharding.AbstractMesh``, a mesh holds axis names, sizes and levels, never devices.
24 H100s on 8-GPU nodes: ``ib0:3 x nvlink0:2 x nvlink1:2 x nvlink2:2``.

Inside the cost model and the search a layout names an axis by its position in the (stage) mesh:
the search indexes meshes millions of times, and ints hash and compare fastest. Everything that
leaves the search (``symtensor.plan.Plan``, plan files, JSON) names axes by their names.

    >>> from symtensor.hardware import load_cluster
    >>> mesh = load_cluster("dgx-h100", devices=24).mesh()
    >>> mesh.names, mesh.size(), mesh.size((1, 2))
    (('ib0', 'nvlink0', 'nvlink1', 'nvlink2'), 24, 4)
    >>> mesh.drop_outer(1).names
    ('nvlink0', 'nvlink1', 'nvlink2')
"""

from __future__ import annotations

from dataclasses import dataclass

from symtensor.errors import PlanError


@dataclass(frozen=True, slots=True)
class Axis:
    """A mesh axis: a prime-sized group of devices on one level of the cluster (0 = innermost)."""

    name: str
    size: int
    level: int


class Mesh(tuple):
    """A tuple of :class:`Axis`, outermost (slowest) level first; immutable and hashable.

    A tuple subclass so that ``mesh[i]``, ``len(mesh)`` and iteration run at tuple speed in the
    cost model's inner loops; the methods below are what the search and the plans need.
    """

    __slots__ = ()

    def __new__(cls, axes=()):
        axes = tuple(axes)
        for a in axes:
            assert isinstance(a, Axis), f"a mesh holds Axis values, got {a!r}"
        names = [a.name for a in axes]
        assert len(set(names)) == len(names), f"mesh axis names must be unique: {names}"
        return super().__new__(cls, axes)

    def __repr__(self) -> str:
        return "Mesh(" + " x ".join(f"{a.name}:{a.size}" for a in self) + ")"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self)

    def size(self, axes=None) -> int:
        """Devices spanned by the axes at positions ``axes`` (all axes when None)."""
        n = 1
        for a in range(len(self)) if axes is None else axes:
            n *= self[a].size
        return n

    def size_of(self, names) -> int:
        """Devices spanned by the axes called ``names``."""
        return self.size(self.position(n) for n in names)

    def position(self, name: str) -> int:
        """The position of the axis called ``name``; a PlanError lists the mesh's names otherwise."""
        for i, a in enumerate(self):
            if a.name == name:
                return i
        raise PlanError(f"unknown mesh axis {name!r}; the mesh has {', '.join(self.names) or 'no axes'}")

    def names_of(self, axes) -> tuple[str, ...]:
        """The names of the axes at positions ``axes``."""
        return tuple(self[a].name for a in axes)

    def drop_outer(self, k: int) -> Mesh:
        """The mesh without its ``k`` outermost axes (they became pipeline stages)."""
        return Mesh(self[k:])

    def outer_axes_for(self, degree: int) -> int | None:
        """How many outermost axes multiply to ``degree`` exactly, or None."""
        prod = 1
        for i, ax in enumerate(self):
            if prod == degree:
                return i
            prod *= ax.size
        return len(self) if prod == degree else None


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending (pairs up to the square root: device counts reach 10^5)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]
