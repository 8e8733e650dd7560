"""The front's noise on fabricated records: the ≈ marks come from the paired test of each
neighbouring pair, p_front from the bootstrap paired by seed, and the noise sentence says
which test and how many pairs differ (issue #29). No sweep runs."""
import numpy as np
import pytest

from nas.noise import compare
from runners.results.front import front, noise_sentence
from runners.results.records import Objective, Point, Replicate, TrialRecord

OBJ = [Objective(name="acc", direction="maximize", measured=True),
       Objective(name="projection_flops", direction="minimize", measured=False)]


def record(i, flops, accs, seeds=None):
    seeds = list(range(len(accs))) if seeds is None else seeds
    reps = [Replicate(index=j, seed=s, status="complete",
                      points=[Point(values={"acc": a, "projection_flops": flops})]) for j, (s, a) in
            enumerate(zip(seeds, accs))]
    mean, se = float(np.mean(accs)), float(np.std(accs, ddof=1) / np.sqrt(len(accs)))
    return TrialRecord(id=f"t{i:04d}", number=i, status="complete", replicates=reps,
                       points=[Point(values={"acc": mean, "projection_flops": flops}, se={"acc": se}, n=len(accs))])


LUCK = np.array([0.0, 0.1, -0.1, 0.05, -0.05])  # a seed effect every candidate shares


def test_ties_use_the_paired_test_and_the_sentence_says_so():
    # B beats A by 0.02 on every seed (paired: far beyond noise; unpaired s.e. ~0.04: within it);
    # C is B plus noise that is not shared (within noise of B)
    a = record(0, 1.0, 0.50 + LUCK)
    b = record(1, 2.0, 0.52 + LUCK + [0.001, -0.001, 0.0, 0.002, -0.002])
    c = record(2, 3.0, 0.53 + LUCK + [0.03, -0.04, 0.02, -0.03, 0.01])
    members = front([a, b, c], OBJ)
    assert [m.trial for m in members] == ["t0000", "t0001", "t0002"]
    ab, bc = members[0].next_pair, members[1].next_pair
    assert ab.paired and ab.p == pytest.approx(compare(b_acc(b), b_acc(a), list(range(5)), list(range(5))).p)
    assert ab.separated() and not bc.separated()
    assert [m.tied for m in members] == [False, True, True]
    assert compare(b_acc(a), b_acc(b)).p > 0.05  # treated as independent, A and B would be "≈"
    sentence = noise_sentence(members, "acc", 5)
    assert sentence == ("1 of 2 neighbouring pairs on the front differ in acc beyond seed noise "
                        "(paired t-test p < 0.05, 5 seeds); 1 is within it.")
    # the bootstrap is paired too: B is better than A on every seed, so on every draw
    assert members[1].p_front == 1.0


def b_acc(rec):
    return [rep.points[0].values["acc"] for rep in rec.replicates]


def test_unshared_seeds_fall_back_to_welch_and_say_so():
    a = record(0, 1.0, [0.5, 0.6, 0.55], seeds=[0, 1, 2])
    b = record(1, 2.0, [0.9, 0.95, 0.92], seeds=[3, 4, 5])
    members = front([a, b], OBJ)
    assert not members[0].next_pair.paired and members[0].tied is False
    assert "Welch t-test p < 0.05" in noise_sentence(members, "acc", 3)
    assert "seeds not shared" in noise_sentence(members, "acc", 3)


def test_all_within_noise_and_unknown_noise_sentences():
    a = record(0, 1.0, [0.5, 0.6, 0.55])
    b = record(1, 2.0, [0.56, 0.5, 0.6])
    members = front([a, b], OBJ)
    assert members[0].tied is True
    assert noise_sentence(members, "acc", 3).startswith("The front's acc differences are within seed noise")
    one = front([record(0, 1.0, [0.5]), record(1, 2.0, [0.6])], OBJ)
    assert one[0].tied is None and noise_sentence(one, "acc", 1).startswith("Seed noise is unknown")
