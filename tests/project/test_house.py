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


def test_every_stored_spec_is_read_through_stored_spec():
    """A stored spec (a record's canonical arch, a checkpoint's, result.json's) is read through
    nas.spec.stored_spec, which migrates it: a reader that validated it directly would see an
    old record's Mamba2 chunk 256 where the checkpoint beside it reads None, and refuse or
    rebuild it differently (the export bug issue #33 left). Only the exported model's own
    code (runners/export/hf, shipped with the weights) validates its config.json directly."""
    import re
    found = [f"{p.relative_to(REPO)}:{i}" for top in ("runners", "benchmarks", "experiments")
             for p in sorted((REPO / top).rglob("*.py"))
             if "export/hf/" not in p.as_posix()
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"ArchSpec\.model_validate(_json)?\(", line)]
    assert not found, found
