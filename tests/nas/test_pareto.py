"""Pareto maths against hand-computed cases."""
import itertools

import numpy as np
import pytest

from nas.pareto import (
    crowding_distance, dominates, epsilon_dominates, hypervolume, knee_point,
    non_dominated_sort, pareto_front,
)

MIN2 = ["minimize", "minimize"]
# quality (max) vs compute (min): the report's main plane
QC = ["maximize", "minimize"]


def _brute_front(values, directions):
    rows = range(len(values))
    return [i for i in rows if not any(dominates(values[j], values[i], directions) for j in rows)]


def _grid_hv(values, reference, steps=2):
    """Hypervolume by counting grid cells of a 3-D box (exact for integer data)."""
    lo = np.min(values, axis=0)
    axes = [np.arange(lo[d], reference[d], 1.0 / steps) + 0.5 / steps for d in range(3)]
    cells = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    covered = np.zeros(len(cells), dtype=bool)
    for p in values:
        covered |= (cells >= p).all(axis=1)
    return covered.sum() / steps**3


def test_front_minimise_two():
    values = [[1, 5], [2, 3], [3, 4], [4, 1], [5, 5]]
    # (3,4) is dominated by (2,3); (5,5) by everything
    assert pareto_front(values, MIN2).tolist() == [0, 1, 3]


def test_front_mixed_directions():
    # (quality, compute): higher quality, lower compute is better
    values = [[0.5, 10], [0.7, 20], [0.6, 30], [0.9, 40], [0.4, 5]]
    assert pareto_front(values, QC).tolist() == [0, 1, 3, 4]
    # flipping a direction flips the answer: now the worst-quality, cheapest point wins alone
    assert pareto_front(values, MIN2).tolist() == [4]


def test_duplicates_all_on_front():
    values = [[1, 2], [1, 2], [2, 1], [2, 2]]
    assert pareto_front(values, MIN2).tolist() == [0, 1, 2]
    assert not dominates([1, 2], [1, 2], MIN2)


def test_ties_in_one_objective_dominate():
    # same compute, worse quality: dominated; same quality, more compute: dominated
    values = [[0.8, 10], [0.7, 10], [0.8, 12]]
    assert pareto_front(values, QC).tolist() == [0]
    assert non_dominated_sort(values, QC)[1].tolist() == [1, 2]


def test_one_point_and_empty():
    assert pareto_front([[3.0, 4.0]], MIN2).tolist() == [0]
    assert pareto_front([], MIN2).tolist() == []
    assert pareto_front(np.empty((0, 2)), MIN2).tolist() == []
    assert non_dominated_sort([], MIN2) == []
    assert crowding_distance([], MIN2).tolist() == []
    assert hypervolume([], MIN2, [1, 1]) == 0.0
    assert knee_point([[3.0, 4.0]], MIN2) == 0
    with pytest.raises(ValueError, match="empty"):
        knee_point([], MIN2)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_rows_rejected(bad):
    values = [[1, 2], [bad, 1], [2, 1], [3, bad]]
    with pytest.raises(ValueError, match=r"rows \[1, 3\]"):
        pareto_front(values, MIN2)
    with pytest.raises(ValueError, match="non-finite"):
        hypervolume(values, MIN2, [5, 5])


def test_bad_shapes_and_directions():
    with pytest.raises(ValueError, match="shape"):
        pareto_front([[1, 2, 3]], MIN2)
    with pytest.raises(ValueError, match="directions"):
        pareto_front([[1, 2]], ["min", "max"])


def test_non_dominated_sort_layers():
    values = [[1, 4], [2, 2], [4, 1], [2, 4], [3, 3], [4, 4], [4, 4]]
    fronts = non_dominated_sort(values, MIN2)
    assert [f.tolist() for f in fronts] == [[0, 1, 2], [3, 4], [5, 6]]


def test_non_dominated_sort_matches_brute_force():
    rng = np.random.default_rng(0)
    values = rng.integers(0, 6, size=(60, 3)).astype(float)
    dirs = ["minimize", "maximize", "minimize"]
    fronts = non_dominated_sort(values, dirs)
    assert sorted(np.concatenate(fronts).tolist()) == list(range(60))
    remaining = list(range(60))
    for front in fronts:
        sub = values[remaining]
        expected = [remaining[i] for i in _brute_front(sub, dirs)]
        assert front.tolist() == expected
        remaining = [i for i in remaining if i not in expected]


def test_crowding_distance_by_hand():
    # sorted by x: 0,1,2,3 ; by y the reverse. spans: x 0..6 = 6, y 0..6 = 6
    values = [[0, 6], [1, 4], [3, 1], [6, 0]]
    d = crowding_distance(values, MIN2)
    assert np.isinf(d[0]) and np.isinf(d[3])
    # row 1: x (3-0)/6 + y (6-1)/6 = 8/6 ; row 2: x (6-1)/6 + y (4-0)/6 = 9/6
    np.testing.assert_allclose(d[1:3], [8 / 6, 9 / 6])
    assert np.isinf(crowding_distance([[1, 2], [3, 4]], MIN2)).all()


def test_crowding_distance_constant_objective_and_duplicates():
    values = [[0, 5], [1, 5], [1, 5], [3, 5]]
    d = crowding_distance(values, MIN2)
    # y is constant, adds nothing; x: row 1 (1-0)/3, row 2 (3-1)/3
    np.testing.assert_allclose(d[1:3], [1 / 3, 2 / 3])
    # the constant column makes its first and last rows extremes, i.e. rows 0 and 3
    assert np.isinf(d[[0, 3]]).all()


def test_hypervolume_2d_by_hand():
    values = [[1, 3], [2, 2], [3, 1]]
    # staircase under reference (4, 4): 3·1 + 2·1 + 1·1 = 6
    assert hypervolume(values, MIN2, [4, 4]) == pytest.approx(6.0)
    # a dominated point and a duplicate change nothing; a point beyond the reference neither
    more = values + [[3, 3], [2, 2], [5, 0]]
    assert hypervolume(more, MIN2, [4, 4]) == pytest.approx(6.0)
    assert hypervolume([[1, 1]], MIN2, [1, 3]) == 0.0


def test_hypervolume_mixed_directions():
    # quality up to ref 0.0, compute up to ref 100: boxes (0.5·50) ∪ (0.8·20) overlap 0.5·20
    values = [[0.5, 50], [0.8, 80]]
    assert hypervolume(values, QC, [0.0, 100]) == pytest.approx(0.5 * 50 + 0.8 * 20 - 0.5 * 20)


def test_hypervolume_3d_by_hand():
    values = [[1, 2, 3], [2, 3, 1], [3, 1, 2]]
    ref = [4, 4, 4]
    # boxes to (4,4,4): 3·2·1 = 6 each; pairwise intersections (max coords):
    # (2,3,3)→2·1·1=2, (3,2,3)→1·2·1=2, (3,3,2)→1·1·2=2; triple (3,3,3)→1.  6·3 − 6 + 1 = 13
    assert hypervolume(values, ["minimize"] * 3, ref) == pytest.approx(13.0)
    assert _grid_hv(np.array(values, float), ref) == pytest.approx(13.0)
    # maximising the same data mirrored about the reference gives the same volume
    mirrored = [[-v for v in row] for row in values]
    assert hypervolume(mirrored, ["maximize"] * 3, [-4, -4, -4]) == pytest.approx(13.0)


def test_hypervolume_3d_random_against_grid():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 4, size=(12, 3)).astype(float)
    ref = [4.0, 4.0, 4.0]
    assert hypervolume(values, ["minimize"] * 3, ref) == pytest.approx(_grid_hv(values, ref))


def test_hypervolume_4d_inclusion_exclusion():
    rng = np.random.default_rng(2)
    values = rng.uniform(0, 1, size=(6, 4))
    ref = np.ones(4)
    expected = 0.0
    for r in range(1, 7):
        for subset in itertools.combinations(range(6), r):
            expected += (-1) ** (r + 1) * np.prod(ref - values[list(subset)].max(axis=0))
    assert hypervolume(values, ["minimize"] * 4, ref) == pytest.approx(expected)


def test_knee_point_by_hand():
    # normalised: (0,1) (0.1,0.3) (0.5,0.1) (1,0): sums 1, 0.4, 0.6, 1 -> row 1
    values = [[0, 10], [1, 3], [5, 1], [10, 0]]
    assert knee_point(values, MIN2) == 1
    # dominated rows are never the knee, even if their sum is small after normalisation
    assert knee_point(values + [[1, 4]], MIN2) == 1


def test_knee_point_mixed_directions_and_ties():
    # quality 0.5..0.9 (max), compute 10..50 (min): row 2 is (0.85, 20)
    values = [[0.5, 10], [0.6, 15], [0.85, 20], [0.9, 50]]
    assert knee_point(values, QC) == 2
    # a straight front: every member ties; the lowest index wins
    assert knee_point([[0, 2], [1, 1], [2, 0]], MIN2) == 0


def test_epsilon_dominance():
    assert epsilon_dominates([1, 1], [1, 1], MIN2, 0.0)
    assert not epsilon_dominates([1.2, 1], [1, 1], MIN2, 0.1)
    assert epsilon_dominates([1.2, 1], [1, 1], MIN2, 0.2)
    assert epsilon_dominates([1.2, 1.5], [1, 1], MIN2, [0.2, 0.5])
    # maximised quality: 0.78 is within 0.05 of 0.80
    assert epsilon_dominates([0.78, 10], [0.80, 10], QC, [0.05, 0])
    assert not epsilon_dominates([0.70, 10], [0.80, 10], QC, [0.05, 0])
    # multiplicative: 10% more compute tolerated
    assert epsilon_dominates([0.8, 110], [0.8, 100], QC, 0.1, kind="multiplicative")
    assert not epsilon_dominates([0.8, 111], [0.8, 100], QC, 0.1, kind="multiplicative")
    with pytest.raises(ValueError, match="non-negative"):
        epsilon_dominates([1, 1], [1, 1], MIN2, -0.1)
