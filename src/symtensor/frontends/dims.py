"""Iteration dims discovered while walking a captured graph: atoms, unification, splitting, names.

Every axis of every captured tensor runs over a tuple of *atoms* (its size is their product).
Atoms are merged by unification (a residual add says its two operands share their dims) and
refined by splitting (a view ``[b, s, 4096] -> [b, s, 32, 128]`` splits the atom of size 4096
into two atoms of sizes 32 and 128). An atom that was split resolves to its parts, so a tensor
created before the split sees the finer dims too; this is how ``q_proj``'s output becomes
``[b, s, n, d]`` although torch computes it as ``[b, s, n*d]``.

Words: an atom is a *leaf* when it is a union-find root that was not split; ``leaves(a)`` is the
tuple of leaves an atom stands for. Two atoms are *apart* when one tensor holds both: unifying
them would give one tensor the same dim twice (the scores ``[b, n, s, t]`` of attention hold
``s`` and ``t``, of the same size, which must stay distinct), so ``unify`` refuses it.

Pure Python; no torch.
"""

from __future__ import annotations


class DimTable:
    """Atoms of iteration dims with union-find, splits, apartness and naming hints.

    Example:
        >>> t = DimTable()
        >>> h = t.new(4096)
        >>> n, d = t.split(h, (32, 128))
        >>> t.leaves(h) == (n, d)
        True
    """

    def __init__(self):
        self.size: list[int] = []
        self.parent: list[int] = []
        self.parts: dict[int, tuple[int, ...]] = {}
        self.apart: dict[int, set[int]] = {}
        self.hints: dict[int, tuple[int, str]] = {}
        self.twin_of: dict[int, int] = {}

    # -- atoms ------------------------------------------------------------------------------------
    def new(self, size: int, hint: str | None = None, priority: int = 0) -> int:
        """A fresh atom of ``size``, optionally with a naming hint."""
        assert isinstance(size, int) and size >= 1, size
        atom = len(self.size)
        self.size.append(size)
        self.parent.append(atom)
        if hint:
            self.hint(atom, hint, priority)
        return atom

    def twin(self, atom: int) -> int:
        """A fresh leaf of the same size as leaf ``atom``, named after it (``s`` -> ``t``)."""
        fresh = self.new(self.size[self.find(atom)])
        self.twin_of[fresh] = atom
        return fresh

    def find(self, atom: int) -> int:
        root = atom
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[atom] != root:
            self.parent[atom], atom = root, self.parent[atom]
        return root

    def leaves(self, atom: int) -> tuple[int, ...]:
        root = self.find(atom)
        parts = self.parts.get(root)
        if parts is None:
            return (root,)
        return tuple(leaf for part in parts for leaf in self.leaves(part))

    def leaves_of(self, atoms) -> tuple[int, ...]:
        """Leaves of a sequence of atoms, concatenated."""
        return tuple(leaf for atom in atoms for leaf in self.leaves(atom))

    def sizes(self, atoms) -> tuple[int, ...]:
        return tuple(self.size[self.find(a)] for a in atoms)

    # -- hints and apartness ----------------------------------------------------------------------
    def hint(self, atom: int, name: str, priority: int) -> None:
        """Suggest a name for every leaf of ``atom``; the highest priority wins."""
        for leaf in self.leaves(atom):
            old = self.hints.get(leaf)
            if old is None or priority > old[0]:
                self.hints[leaf] = (priority, name)

    def hint_of(self, atom: int) -> tuple[int, str] | None:
        return self.hints.get(self.find(atom))

    def mark_apart(self, leaves) -> None:
        """Record that these leaves sit in one tensor, so must never be unified."""
        leaves = [leaf for leaf in leaves if self.size[leaf] > 1]
        for i, a in enumerate(leaves):
            for b in leaves[i + 1:]:
                if a != b:
                    self.apart.setdefault(a, set()).add(b)
                    self.apart.setdefault(b, set()).add(a)

    def are_apart(self, a: int, b: int) -> bool:
        ra, rb = self.find(a), self.find(b)
        sa, sb = self.apart.get(ra, ()), self.apart.get(rb, ())
        if len(sb) < len(sa):
            ra, rb, sa = rb, ra, sb
        return any(rb in self.leaves(x) for x in sa)

    # -- splitting --------------------------------------------------------------------------------
    def split(self, leaf: int, sizes: tuple[int, ...]) -> tuple[int, ...]:
        """Refine a leaf into parts whose sizes multiply to its size (row-major order)."""
        root = self.find(leaf)
        assert root not in self.parts, "split a leaf, not an atom that is already split"
        total = 1
        for size in sizes:
            total *= size
        assert total == self.size[root], (sizes, self.size[root])
        parts = tuple(self.new(size) for size in sizes)
        self.parts[root] = parts
        inherited = self.apart.get(root, set())
        for p in parts:
            self.apart[p] = set(inherited) | {q for q in parts if q != p}
        return parts

    def refinement(self, a_leaves, b_leaves) -> list[tuple[int, int]] | None:
        """Splits that give two leaf sequences of equal total size the same boundaries.

        Returns ``[(leaf, cut), ...]``: split ``leaf`` after a first part of size ``cut``;
        ``None`` when no common refinement exists (e.g. ``[6, 4]`` against ``[4, 6]``).
        Size-1 leaves are ignored. Nothing is changed; :meth:`apply_cuts` does it.
        """
        a = [x for x in a_leaves if self.size[x] > 1]
        b = [x for x in b_leaves if self.size[x] > 1]
        cuts = []
        for mine, other in ((a, b), (b, a)):
            bounds = _prefix_products(self.size[x] for x in other)
            start = 1
            for leaf in mine:
                size = self.size[leaf]
                inner = [p for p in bounds if start < p < start * size]
                prev = 1
                for p in inner:
                    if p % start or (p // start) % prev:
                        return None
                    step = p // start // prev
                    if size % (prev * step):
                        return None
                    prev *= step
                if inner:
                    cuts.append((leaf, tuple(_steps(inner, start, size))))
                start *= size
        return cuts

    def apply_cuts(self, cuts) -> None:
        for leaf, sizes in cuts:
            if self.find(leaf) not in self.parts:
                self.split(leaf, sizes)

    def align(self, a_atoms, b_atoms) -> list[tuple[int, int]] | None:
        """Refine two atom sequences of equal size to common leaves; return the leaf pairs."""
        cuts = self.refinement(self.leaves_of(a_atoms), self.leaves_of(b_atoms))
        if cuts is None:
            return None
        self.apply_cuts(cuts)
        a = [x for x in self.leaves_of(a_atoms) if self.size[x] > 1]
        b = [x for x in self.leaves_of(b_atoms) if self.size[x] > 1]
        if len(a) != len(b) or any(self.size[x] != self.size[y] for x, y in zip(a, b)):
            return None
        return list(zip(a, b))

    def regroup(self, axes, shape) -> tuple[tuple[int, ...], ...] | None:
        """The atoms of each axis after a row-major view of ``axes`` to ``shape``.

        Leaves are cut where an output axis ends inside one (``[4096] -> [32, 128]``) and grouped
        where an output axis spans several (``[b, s] -> [b*s]``). Size-1 leaves go to size-1 output
        axes when they can, else to the axis before them. None (and nothing changed) when a cut
        does not divide a leaf, e.g. ``[6, 4] -> [4, 6]``.
        """
        items = [(leaf, self.size[leaf]) for leaf in self.leaves_of(a for axis in axes for a in axis)]
        plan = _plan_regroup(items, tuple(shape))
        if plan is None:
            return None
        groups, cuts = plan
        made = {leaf: self.split(leaf, tuple(sizes)) for leaf, sizes in cuts.items()}
        return tuple(tuple(leaf if part is None else made[leaf][part] for leaf, part in group) for group in groups)

    # -- unification ------------------------------------------------------------------------------
    def union(self, a: int, b: int) -> bool:
        """Merge two leaves of equal size unless they are apart; True when they are one now."""
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return True
        assert ra not in self.parts and rb not in self.parts
        if self.size[ra] != self.size[rb] or self.are_apart(ra, rb):
            return False
        self.parent[rb] = ra
        hint = self.hints.pop(rb, None)
        if hint is not None and (ra not in self.hints or hint[0] > self.hints[ra][0]):
            self.hints[ra] = hint
        merged = self.apart.pop(rb, set())
        if merged:
            self.apart.setdefault(ra, set()).update(merged)
        if rb in self.twin_of and ra not in self.twin_of:
            self.twin_of[ra] = self.twin_of[rb]
        return True

    def unify(self, a_atoms, b_atoms) -> list[tuple[int, int]]:
        """Make two atom sequences of equal size the same dims where possible.

        Returns the leaf pairs that could not be merged (apart, or no common refinement: then
        the whole sequences are returned as one pair of tuples); the caller renames those
        locally in the operator that needed them equal.
        """
        pairs = self.align(a_atoms, b_atoms)
        if pairs is None:
            return [(tuple(self.leaves_of(a_atoms)), tuple(self.leaves_of(b_atoms)))]
        return [(x, y) for x, y in pairs if not self.union(x, y)]


def _plan_regroup(items, shape):
    """``(groups, cuts)`` for :meth:`DimTable.regroup`: per output axis a list of ``(leaf, part)``
    (``part`` None for a whole leaf), and per leaf to cut the sizes of its parts."""
    groups, cuts, pos, rem = [], {}, 0, None
    for target in shape:
        group, prod = [], 1
        if target == 1:
            while rem is None and pos < len(items) and items[pos][1] == 1:
                group.append((items[pos][0], None))
                pos += 1
        while prod < target:
            if pos >= len(items):
                return None
            leaf, size = items[pos]
            cur = size if rem is None else rem
            if prod * cur <= target:
                if rem is None:
                    group.append((leaf, None))
                else:
                    cuts[leaf].append(cur)
                    group.append((leaf, len(cuts[leaf]) - 1))
                prod, pos, rem = prod * cur, pos + 1, None
                continue
            need = target // prod
            if target % prod or cur % need:
                return None
            cuts.setdefault(leaf, []).append(need)
            group.append((leaf, len(cuts[leaf]) - 1))
            prod, rem = target, cur // need
        groups.append(group)
    rest = items[pos:]
    if rem is not None or any(size != 1 for _, size in rest) or (rest and not groups):
        return None
    if rest:
        groups[-1].extend((leaf, None) for leaf, _ in rest)
    return groups, cuts


def _prefix_products(sizes) -> list[int]:
    out, p = [], 1
    for size in sizes:
        p *= size
        out.append(p)
    return out


def _steps(bounds, start, size):
    """Sizes of the parts of a leaf spanning ``[start, start*size)`` cut at ``bounds``."""
    prev = start
    for p in bounds:
        yield p // prev
        prev = p
    yield start * size // prev
