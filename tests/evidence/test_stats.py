"""The gates' statistics against independent computations."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from evidence.stats import mcnemar_exact_greater, paired_bounds


@pytest.mark.parametrize("seed", range(6))
def test_mcnemar_matches_binomtest(seed):
    rng = random.Random(seed)
    n = rng.choice([20, 64, 256, 1024])
    cand = [rng.random() < 0.6 for _ in range(n)]
    base = [rng.random() < 0.45 for _ in range(n)]
    res = mcnemar_exact_greater(cand, base)
    b = sum(c and not s for c, s in zip(cand, base))
    c = sum(s and not c for c, s in zip(cand, base))
    assert (res.candidate_only, res.baseline_only) == (b, c)
    want = stats.binomtest(b, b + c, 0.5, alternative="greater").pvalue
    assert res.p_value == pytest.approx(want, rel=1e-12)


def test_mcnemar_by_hand_and_edges():
    # 9 discordant pairs, all for the candidate: p = 2^-9
    assert mcnemar_exact_greater([1] * 9 + [0], [0] * 9 + [0]).p_value == pytest.approx(2 ** -9)
    # no discordant pairs: no evidence at all
    assert mcnemar_exact_greater([1, 0, 1], [1, 0, 1]).p_value == 1.0
    # all discordant pairs against the candidate: p = 1
    assert mcnemar_exact_greater([0, 0], [1, 1]).p_value == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact_greater([1], [1, 0])


@pytest.mark.parametrize("seed", range(4))
def test_paired_bounds_match_scipy_ttest_rel(seed):
    rng = random.Random(100 + seed)
    n = rng.choice([8, 128, 1024])
    a = [rng.gauss(1.0, 0.3) for _ in range(n)]
    b = [x + rng.gauss(-0.01, 0.05) for x in a]
    got = paired_bounds(a, b, 0.99)
    lo = stats.ttest_rel(a, b, alternative="greater").confidence_interval(0.99).low
    hi = stats.ttest_rel(a, b, alternative="less").confidence_interval(0.99).high
    assert got.lower == pytest.approx(lo, rel=1e-9, abs=1e-12)
    assert got.upper == pytest.approx(hi, rel=1e-9, abs=1e-12)


def test_paired_bound_on_binary_accuracy_by_hand():
    # 10 pairs: 3 gained, 1 lost, 6 unchanged → d̄ = 0.2, s² = (3·0.64 + 1·1.44 + 6·0.04)/9
    cand = [1, 1, 1, 0, 1, 1, 0, 0, 1, 0]
    base = [0, 0, 0, 1, 1, 1, 0, 0, 1, 0]
    got = paired_bounds(cand, base, 0.99)
    sd = math.sqrt((3 * 0.64 + 1.44 + 6 * 0.04) / 9)
    t = stats.t.ppf(0.99, 9)
    assert got.mean_difference == pytest.approx(0.2)
    assert got.sd == pytest.approx(sd)
    assert got.lower == pytest.approx(0.2 - t * sd / math.sqrt(10))
    with pytest.raises(ValueError):
        paired_bounds([1.0], [0.0])
