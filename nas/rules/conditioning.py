"""ELR loop conditioning: ``index_emb[t]`` (and ``budget_emb[k − 1]`` for ``index_budget``)
added to the state entering iteration t of k; tables (m, d), zero-initialised, elementwise."""
from . import Extra, GraphStep, Rule, register_option


@register_option("conditioning", lambda r: r.conditioning != "none")
class Conditioning(Rule):
    def extras(self, r, d, m):
        tables = ("index_emb", "budget_emb") if r.conditioning == "index_budget" else ("index_emb",)
        return tuple(Extra(name, m * d) for name in tables)

    def label(self, r, arch):
        return {"index": "index cond", "index_budget": "index+budget cond"}[r.conditioning]

    def before(self, r, t):
        return (GraphStep("condition", r.conditioning, "cond"),)

    def per_loop_rows(self, r):
        return True
