"""``model(ids, loops=k)`` and ``projection_flops(arch, loops=k)`` allow the same loop
counts, and refuse the others with one message naming the fix."""
import pytest
import torch

from builders.model import build_model
from nas.cost import projection_flops
from nas.plan import loop_count_problem
from nas.spec import PlainUpdate

from helpers import arch


@pytest.mark.parametrize("name,k", [("tiny_mixerloop", 5), ("tiny_elr", 5)])
def test_beyond_the_built_rows_is_a_clear_error(name, k):
    """ρ (MixerLoop) and the conditioning tables (ELR) have max_loops rows; k = 5 once
    raised a raw IndexError from the executor while the cost model priced it."""
    a = arch(name)
    model = build_model(a).eval()
    ids = torch.randint(0, a.model.vocab_size, (1, 8))
    fix = f"add {k} to elastic.eval in the spec"
    with pytest.raises(ValueError, match=fix):
        model(ids, loops=k)
    with pytest.raises(ValueError, match=fix):
        projection_flops(a, loops=k)
    model(ids, loops=k - 1)
    projection_flops(a, loops=k - 1)


def test_without_per_loop_rows_any_count_within_the_cap_runs():
    full = arch("tiny_fullloop")
    a = full.model_copy(update={"loops": tuple(r.model_copy(update={"update": PlainUpdate()})
                                               for r in full.loops)})
    assert loop_count_problem(a, 7) is None
    model = build_model(a).eval()
    model(torch.randint(0, a.model.vocab_size, (1, 8)), loops=7)
    assert projection_flops(a, loops=7).total > projection_flops(a).total
    assert "over the cap" in loop_count_problem(a, 1 << 19)
    for bad in (0, -1, 2.0):
        with pytest.raises(ValueError, match=">= 1"):
            projection_flops(a, loops=bad)
