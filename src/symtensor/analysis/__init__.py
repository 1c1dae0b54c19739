"""Making plans understandable: per-op cost terms, explain, compare and sweep.

    terms.py    the cost terms of one op under one layout (compute, communication,
                redistribution, memory), in the search's own decomposition
    formula.py  the same terms as sympy expressions of dims, cut factors and hardware constants
    explain.py  per layer type and mesh axis: the candidates, their terms and the winner
    compare.py  two plans (or a plan and a baseline): where they differ and what it costs
    sweep.py    plans across a range of sequence lengths, device counts or batches; breakpoints

Everything returns plain values (dicts of numbers and strings); ``report/`` prints them.
"""
