"""What each gate can reach at a profile (evidence/attainability.py), against brute force with the
gates' own statistics, the arm kinds' own synchronization count, and the three experiments' profiles."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as st

from evidence import attainability as at
from evidence.stats import mcnemar_exact_greater, paired_bounds


def every_outcome(n: int):
    """Every (won, lost) split of `n` paired cases, with the verdict lists that realize it."""
    for won in range(n + 1):
        for lost in range(n - won + 1):
            yield won, lost, at._pairs(n, won, lost)


@pytest.mark.parametrize("n", [1, 5, 6, 7, 8, 12, 32])
@pytest.mark.parametrize("p_max", [0.01, 0.05])
def test_mcnemar_minimum_is_the_least_discordance_and_gain_that_passes(n, p_max):
    passing = [(w, l) for w, l, xy in every_outcome(n) if mcnemar_exact_greater(*xy).p_value <= p_max]
    k = at.mcnemar_min_discordant(n, p_max)
    if not passing:
        assert k is None
        return
    assert k == min(w + l for w, l in passing) == min(w - l for w, l in passing)
    assert all(l == 0 for w, l in passing if w + l == k)  # the fewest: every one of them for the candidate


def test_mcnemar_at_the_profiles_sizes():
    """p = 2^-b with all b discordant pairs for the candidate: 7 is the fewest for 0.01 (0.0078)."""
    assert [at.mcnemar_min_discordant(n, 0.01) for n in (6, 7, 32, 1024)] == [None, 7, 7, 7]
    assert at.mcnemar_min_discordant(32, 0.05) == 5


@pytest.mark.parametrize("n,min_pp", [(32, 5.0), (32, 10.0), (20, 5.0), (64, 10.0), (3, 50.0), (4, 0.0)])
def test_gain_minimum_is_the_least_net_gain_that_passes(n, min_pp):
    passing = [w - l for w, l, xy in every_outcome(n)
               if paired_bounds(*xy).mean_difference * 100 >= min_pp]
    assert at.gain_min_net_cases(n, min_pp) == min(passing)


@pytest.mark.parametrize("n", [8, 32, 64])
def test_noninferiority_reach_against_every_outcome(n):
    margin, conf = -3.0, 0.99
    ok = {(w, l): paired_bounds(*xy, conf).lower * 100 >= margin for w, l, xy in every_outcome(n)}
    r = at.noninferiority_reach(n, margin, conf)
    assert r["identical_bound_pp"] == 0.0 and ok[(0, 0)]
    lost = r["most_lost_passing"]
    assert all(ok[(0, c)] for c in range(lost + 1)) and not ok[(0, lost + 1)]
    won = r["fewest_won_passing"]
    assert ok[(won, 0)] and not any(ok[(b, 0)] for b in range(1, won))
    assert r["one_lost_bound_pp"] == pytest.approx(paired_bounds(*at._pairs(n, 0, 1), conf).lower * 100)


def test_noninferiority_at_32_cases_fails_on_any_single_discordant_case():
    """The cpu and smoke profiles' 32 cases: identical answers pass; one case lost (−10.8 pp) or won
    (−4.5 pp) alone fails the −3 pp margin; with none lost it takes 4 won."""
    r = at.noninferiority_reach(32, -3.0, 0.99)
    assert r["most_lost_passing"] == 0 and r["fewest_won_passing"] == 4
    assert r["one_lost_bound_pp"] == pytest.approx(-10.79, abs=0.01)
    assert r["one_won_bound_pp"] == pytest.approx(-4.54, abs=0.01)
    assert at.noninferiority_reach(1024, -3.0, 0.99)["most_lost_passing"] == 20


def test_retention_factor_is_the_bounds_own():
    for n in (2, 8, 16, 128):
        k = at.retention_factor(n, 0.99)
        assert k == pytest.approx(st.t.ppf(0.99, n - 1) / math.sqrt(n))
        rng = random.Random(n)
        a, b = [rng.gauss(0, 1) for _ in range(n)], [rng.gauss(0, 1) for _ in range(n)]
        pb = paired_bounds(a, b, 0.99)
        assert pb.upper == pytest.approx(pb.mean_difference + k * pb.sd)
    assert at.retention_factor(1, 0.99) is None


def test_model_exchanges_agree_with_the_arm_kinds():
    """evidence knows no arm kinds: its count of whole-model exchanges (and the H it reads from the
    profile) must be what training's registry and spec give, for every arm of every profile."""
    from training.arms import KINDS
    from training.config import experiment_names, load_experiment, resolve
    from training.train import _spec

    checked = 0
    for name in experiment_names():
        for profile in load_experiment(name).profiles:
            cfg = resolve(name, profile)
            d = cfg.as_dict()
            for arm in cfg.experiment.arms:
                if not arm.trains:
                    continue
                spec = _spec(arm, cfg, [list(range(cfg.global_batch))] * cfg.profile.updates, arm.world_size, 0,
                             None)
                a = next(x for x in d["experiment"]["arms"] if x["name"] == arm.name)
                h = at.sync_every(a, d["profile"])
                assert h == getattr(spec.settings, "sync_every", None)
                n = at.model_exchanges(a, d["profile"])
                if arm.kind in ("ddp", "diloco"):
                    assert n == KINDS[arm.kind].synchronizations(cfg.profile.updates, spec.settings)
                    checked += 1
                else:
                    assert n is None  # single: none to compare; powersgd: a compressed, measured payload
    assert checked >= 10


def test_smallest_h_within_a_ratio():
    assert at.smallest_h_within(16, 0.125) == 8 and at.smallest_h_within(128, 0.125) == 8
    assert at.smallest_h_within(8, 0.125) == 8 and at.smallest_h_within(10, 0.05) is None


def analysed(name: str, profile: str, cluster=None) -> dict:
    from training.config import resolve

    return at.by_gate(at.analyse(resolve(name, profile).as_dict(), cluster))


def test_the_three_experiments_at_their_profiles():
    """Unattainable only where it is proved: DiLoCo's bytes at H = 4 (smoke, cpu); never a timing gate."""
    local = {"source": "local", "cores": 2}
    for profile in ("smoke", "cpu"):
        g = analysed("local-training-windows", profile, local)
        assert g["bytes ≤ 0.125 × ddp-four"]["attainable"] is False
        assert g["bytes ≤ 0.125 × ddp-four"]["figures"]["ratio"] == 0.25
        assert "passing needs H ≥ 8" in g["bytes ≤ 0.125 × ddp-four"]["attainability"]
        assert g["McNemar p ≤ 0.01"]["attainable"] is True and g["McNemar p ≤ 0.01"]["figures"]["min_discordant"] == 7
        assert g["active time ≤ 0.5 × ddp-four"]["attainable"] is None
        assert "4 ranks share this machine's 2 CPU cores" in g["active time ≤ 0.5 × ddp-four"]["attainability"]
    g = analysed("local-training-windows", "gpu")
    assert g["bytes ≤ 0.125 × ddp-four"]["attainable"] is True and g["bytes ≤ 0.125 × ddp-four"]["figures"]["ratio"] == 0.0625
    assert "cores" not in g["active time ≤ 0.5 × ddp-four"]["attainability"]
    for name in ("cooperative-learning", "batched-learning"):
        for profile in ("smoke", "cpu", "gpu"):
            assert all(x["attainable"] is not False for x in analysed(name, profile, local).values())
    b = analysed("batched-learning", "cpu", local)
    assert b["active speedup ≥ 1.1"]["attainable"] is None and "no more cores" in b["active speedup ≥ 1.1"]["attainability"]


def test_a_profile_too_small_for_a_gate_is_unattainable():
    from training.config import resolve

    d = resolve("local-training-windows", "smoke").as_dict()
    d["profile"] = {**d["profile"], "test": 6, "probes": 1}
    g = at.by_gate(at.analyse(d))
    assert g["McNemar p ≤ 0.01"]["attainable"] is False and "p = 0.0156 > 0.01" in g["McNemar p ≤ 0.01"]["attainability"]
    assert g["retention upper bound ≤ +0.02 nats"]["attainable"] is False
    assert g["gain ≥ 5.0 pp"]["attainable"] is True  # one case of six is 16.7 pp


def test_disagreement_names_the_gate():
    from training.config import resolve

    d = resolve("local-training-windows", "smoke").as_dict()
    a = at.analyse(d, {"source": "local", "cores": 2})
    assert at.disagreement(a, at.analyse(d, {"source": "local", "cores": 2})) is None
    edited = {**a, "gates": [{**g, "attainable": True} if g["gate"].startswith("bytes") else g for g in a["gates"]]}
    assert "gate 'bytes ≤ 0.125 × ddp-four'" in at.disagreement(edited, a)
    reworded = {**a, "gates": [{**g, "attainability": "said otherwise"} for g in a["gates"]]}
    assert at.disagreement(reworded, a) is None  # the words may change between versions; the verdicts may not
    other = at.analyse(resolve("local-training-windows", "gpu").as_dict(), {"source": "local", "cores": 2})
    assert "its profile" in at.disagreement(other, a)


def test_a_verdict_says_unattainable_beside_failed_and_never_turns_it_into_a_pass():
    from evidence.report import Gate, Report
    from evidence.report.render import closing, verdict

    cannot = {"gate": BYTES_GATE, "value": 0.25, "passed": False, "attainable": False, "attainability": "H = 4: 0.25"}
    assert verdict(Gate(**cannot)) == f"FAILED ({at.UNATTAINABLE}: H = 4: 0.25)"
    assert verdict(Gate(**{**cannot, "attainable": True})) == "FAILED"
    assert verdict(Gate(**{**cannot, "passed": True})) == "passed"  # a pass stays a pass, whatever the analysis
    both = {**cannot, "gate": "active time ≤ 0.5 × ddp-four", "passed": None, "comparable": False,
            "reason": "not comparable: diloco-four: 4 ranks shared 1 GPU"}
    assert verdict(Gate(**both)) == f"not comparable: diloco-four: 4 ranks shared 1 GPU; {at.UNATTAINABLE}: H = 4: 0.25"
    rep = Report.model_construct(  # closing reads the gate lists only
        gates=[cannot, {"gate": "gain", "passed": False}, {"gate": "p", "passed": True}, both],
        failed_gates=[BYTES_GATE, "gain"], unattainable_failed_gates=[BYTES_GATE],
        not_evaluated_gates=[], not_comparable_gates=[both["gate"]])
    assert closing(rep) == [f"gates: 1 of 4 passed; failed: gain; failed, {at.UNATTAINABLE} (could not have passed): "
                            f"{BYTES_GATE}; not comparable (GPUs shared on purpose): {both['gate']}"]
    assert closing(rep, md=True)[:3] == ["**Gates: 1 of 4 passed.**", "- Failed: gain",
                                         f"- Failed, {at.UNATTAINABLE} (could not have passed): {BYTES_GATE}"]


BYTES_GATE = "bytes ≤ 0.125 × ddp-four"


def test_the_cores_are_said_only_where_the_ranks_compute_on_them():
    """A CUDA profile's ranks compute on their GPUs: the local cluster's CPU cores are not what a
    timing gate's reach depends on there, so they go unsaid."""
    local = {"source": "local", "cores": 2}
    assert "CPU cores" in analysed("batched-learning", "cpu", local)["active speedup ≥ 1.1"]["attainability"]
    gpu = analysed("batched-learning", "gpu", local)["active speedup ≥ 1.1"]["attainability"]
    assert "CPU cores" not in gpu and "on a device each" in gpu


def test_the_bytes_verdict_stands_only_where_the_ranks_bytes_agree_with_it():
    """The construction assumes each exchange moves the model's worth for both arms; a measured ratio
    that differs (say a compressed outer step) leaves the gate to measurement, never unattainable."""
    reach = analysed("local-training-windows", "smoke")
    gate = {"gate": BYTES_GATE, "value": 0.25, "passed": False}
    assert at.labelled(gate, reach)["attainable"] is False
    other = at.labelled({**gate, "value": 0.1}, reach)
    assert other["attainable"] is None and other["attainability"].startswith("measured 0.1, not the 0.25")
    assert at.labelled({**gate, "value": None, "passed": None}, reach)["attainable"] is False
