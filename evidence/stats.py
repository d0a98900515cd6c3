"""Paired statistics for the acceptance gates. Each formula is written out beside its code.

Every comparison is paired: the same test cases (or retention probes) scored for two models.

Exact one-sided McNemar (sign) test, candidate better than baseline
    b = #(candidate right, baseline wrong), c = #(candidate wrong, baseline right), n = b + c.
    Under H0 the discordant pairs split like fair coin flips, so
        p = P(X ≥ b) = Σ_{k=b..n} C(n, k) / 2ⁿ,  X ~ Binomial(n, ½)      (p = 1 when n = 0)
    summed in exact integers and divided once (Python rounds an integer quotient correctly), so p is the
    float nearest the exact tail.

Approximate paired one-sided bounds (accuracy change, retention loss change)
    d_i = a_i − b_i per pair (a_i, b_i ∈ {0, 1} for accuracy, nats for loss), d̄ its mean,
    s its sample standard deviation (ddof = 1), n pairs, t = Student-t quantile at `confidence`
    with n − 1 degrees of freedom:
        lower = d̄ − t · s / √n        upper = d̄ + t · s / √n
    A Wald-type interval: approximate, good for the large n the gates use (1,024 / 256 cases,
    128 probes); with s = 0 the bound is d̄ itself. t is `scipy.special.stdtrit`, the function
    `scipy.stats.t.ppf` evaluates: importing scipy.stats costs ~0.45 s of CPU more than scipy.special,
    in every `evidence report` and `orchestrate run`/`plan` process (tests/evidence/test_stats.py still
    checks both statistics against scipy.stats).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class McNemar:
    n_pairs: int
    candidate_only: int  # b
    baseline_only: int  # c
    p_value: float

    def as_dict(self) -> dict:
        return asdict(self)


def mcnemar_exact_greater(candidate: Sequence[bool], baseline: Sequence[bool]) -> McNemar:
    if len(candidate) != len(baseline):
        raise ValueError("paired samples must have equal length")
    b = sum(1 for x, y in zip(candidate, baseline) if x and not y)
    c = sum(1 for x, y in zip(candidate, baseline) if y and not x)
    n = b + c
    term, tail = math.comb(n, b), 0  # C(n, k) for k = b..n, each from the last: exact integers throughout
    for k in range(b, n + 1):
        tail += term
        term = term * (n - k) // (k + 1)
    return McNemar(len(candidate), b, c, tail / 2**n)  # one rounding; n = 0 gives 1


@dataclass(frozen=True)
class PairedBound:
    n: int
    mean_difference: float
    sd: float
    confidence: float
    lower: float
    upper: float

    def as_dict(self) -> dict:
        return asdict(self)


def paired_bounds(a: Sequence[float], b: Sequence[float], confidence: float = 0.99) -> PairedBound:
    """One-sided `confidence` lower and upper bounds for mean(a − b) (see the module docstring)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have equal length")
    n = len(a)
    if n < 2:
        raise ValueError("a paired bound needs at least two pairs")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    mean = sum(d) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    # start-up: scipy.special costs ~0.5 s to import (measured with -X importtime, 2026-12-06), paid
    # here only, not by every command line that imports the report's modules (`orchestrate --help`)
    from scipy.special import stdtrit

    half = float(stdtrit(n - 1, confidence)) * sd / math.sqrt(n)  # what scipy.stats.t.ppf computes
    return PairedBound(n, mean, sd, confidence, mean - half, mean + half)
