"""A define-by-run space: what YAML's ``when`` cannot say.

The number of full-attention layers is searched first; only hybrids (at least one
attention layer) then choose a placement, and only looped candidates a loop-level window
schedule whose length must equal their T. ``sample(trial, base)`` returns a user-level spec.

    loopnas validate spaces/hybrid_define_by_run.py
    loopnas sweep spaces/hybrid_define_by_run.py --trials 8
"""

SPACE = {
    "name": "hybrid_define_by_run",
    "base": "tiny_lt2_interleave",
    "objectives": [
        {"metric": "acc", "direction": "maximize"},
        {"metric": "kv_bytes", "seq_len": 32768, "direction": "minimize"},
    ],
    "proxy": {"task": "s5", "task_params": {"seq_len": 16, "degree": 3}, "steps": 200,
              "batch_size": 32, "lr": 0.01, "eval_every": 50},
    "search": {"sampler": "tpe", "trials": 8, "concurrency": 2},
}


def sample(trial, base):
    layers = base["num_layers"]
    full = trial.suggest_int("full_layers", 0, layers // 2)
    if full == 0:
        base.pop("hybrid")
        base["layer"] = {"mixer": {"kind": "gdn"}, "ffn": {"kind": "swiglu"}}
    else:
        base["hybrid"] = {"ratio": {"attn": full, "gdn": layers - full},
                          "placement": trial.suggest_categorical("placement", ["interleave", "bookend", "front"])}
    T = trial.suggest_int("T", 1, 4)
    if T == 1:
        base.pop("loop", None)
        return base
    base["loop"] = {"boundary": "block", "T": T, "update": {"kind": "residual_gate"}}
    if full and trial.suggest_categorical("schedule", ["depth", "coarse_to_fine"]) == "coarse_to_fine":
        base["loop"]["windows"] = ["full", 8, 4, 2][:T]
    return base
