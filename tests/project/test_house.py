"""One place per concept: the cost-metric map (nas.metrics) is shared by the sweep and the report."""
import pytest

from nas.cost import cost, sheet_value
from nas.load import load_arch
from nas.metrics import COST_METRICS
from nas.space import cost_value
from spaces import arch_path
from helpers import REPO


@pytest.mark.parametrize("metric", sorted(COST_METRICS))
def test_cost_value_is_the_sheet_value_at_every_k(metric):
    arch = load_arch(arch_path("tiny_elr"))
    sheet = cost(arch, seq_len=256)
    by_attr = {  # the sheet's own attributes, independently of the map
        "unique_params": lambda f: sheet.unique_params,
        "non_embedding_params": lambda f: sheet.non_embedding_params,
        "train_flops": lambda f: sheet.train_flops_per_token,
        "projection_flops": lambda f: f.projection.total,
        "forward_flops": lambda f: f.forward_flops,
        "seq_mixing_flops": lambda f: f.seq_mixing_flops,
        "kv_bytes": lambda f: f.kv_cache_bytes + f.state_bytes,
        "kv_cache_bytes": lambda f: f.kv_cache_bytes,
        "state_bytes": lambda f: f.state_bytes,
    }[metric]
    for k in (None, *arch.elastic.eval):
        expected = float(by_attr(sheet.figures if k is None else sheet.at(k)))
        assert cost_value(arch, metric, 256, k=k) == pytest.approx(expected)
        assert sheet_value(sheet.to_dict(), metric, k) == pytest.approx(expected)


def test_no_section_banners_in_library_code():
    """House style: a module too long to read without '# ----' banners is split instead."""
    import re
    from pathlib import Path

    root = REPO
    banners = [f"{p.relative_to(root)}:{i}" for top in ("nas", "builders", "runners", "spaces")
               for p in sorted((root / top).rglob("*.py"))
               for i, line in enumerate(p.read_text().splitlines(), 1) if re.match(r"\s*# -{5,}", line)]
    assert banners == []
