"""The experiment index (EXP/index.json, index.more.json: runners.results.records.iter_index)
and the report's reader of digests (runners.results.experiment.read_candidates): JSON lines
read one at a time; a record re-read only when its file changed or its line is not a digest;
the files rewritten only when something changed, to what a cold read writes; a damaged,
planted or older index never crashes a reader, and a line that is not a digest of the shape
the reader needs is not used (a well-formed digest with wrong numbers is, as before the
index had lines: the index is the readers' cache, not a record); the report from digests
(elastic points, rungs, an objective the cost sheet supplies) equals the report from the
records themselves."""
import copy
import json
import os
from pathlib import Path

import numpy as np
import pytest

import runners.results.records as records
from runners.results.experiment import read_candidates
from runners.results.records import (
    INDEX, INDEX_MORE, ExperimentRecord, Objective, Point, Replicate, Rung, TrialRecord, iter_index, read_index,
    write_json,
)

OBJECTIVES = [Objective(name="acc", direction="maximize", measured=True),
              Objective(name="projection_flops", direction="minimize", measured=False),
              Objective(name="kv_bytes", direction="minimize", measured=False)]  # from the cost sheet: not in values


def _sheet(n: int, ks: list[int] | None) -> dict:
    figures = {"projection_flops_per_token": 1e5 + 997 * n, "forward_flops_per_token": 2e5 + 13 * n,
               "kv_cache_bytes": 1024 * (n % 7 + 1), "state_bytes": 256 * (n % 3)}
    sheet = {**figures, "unique_params": 60_000 + n, "train_flops_per_token": 6e5}
    if ks:
        sheet["per_k"] = {str(k): {f: v * k for f, v in figures.items()} for k in ks}
    return sheet


def experiment(root: Path, n: int = 40, seed: int = 0) -> Path:
    """``n`` complete records (every fifth elastic, at k = 1 and 2; a failed and a running one
    besides), 3 seeds, rungs at steps 10 and 20, objectives acc, projection_flops (in the
    points' values) and kv_bytes (the cost sheet's only)."""
    rng = np.random.default_rng(seed)
    (root / "trials").mkdir(parents=True)
    write_json(root / "experiment.json", ExperimentRecord(name="idx", space={}, objectives=OBJECTIVES,
                                                          engine="optuna", trials=n + 2, seeds=3, created=0.0,
                                                          seq_len=64))
    for i in range(n):
        ks = [1, 2] if i % 5 == 0 else None
        sheet = _sheet(i, ks)
        at = ks or [None]
        reps = []
        for r in range(3):
            points = [Point(k=k, values={"acc": float(0.5 + 0.3 * np.sin(i) + 0.05 * rng.normal() + 0.02 * (k or 0)),
                                         "projection_flops": sheet["projection_flops_per_token"] * (k or 1)})
                      for k in at]
            reps.append(Replicate(index=r, seed=r, status="complete", points=points,
                                  rungs=[Rung(step=10, quality=0.1)]))
        means = [Point(k=k, values={"acc": float(np.mean([p.values["acc"] for rep in reps for p in rep.points
                                                          if p.k == k])),
                                    "projection_flops": sheet["projection_flops_per_token"] * (k or 1)},
                       se={"acc": float(rng.uniform(0.005, 0.03)), "projection_flops": 0.0}, n=3) for k in at]
        write_json(root / "trials" / f"t{i:04d}.json", TrialRecord(
            id=f"t{i:04d}", number=i, status="complete", summary=f"candidate {i}", params={"w": i % 4, "d": i % 3},
            cost=sheet, points=means, replicates=reps, finished=1000.0 + (i * 7919) % n,
            rungs=[Rung(step=10, quality=float(rng.uniform(0, 0.5))),
                   Rung(step=20, quality=None if i == 3 else float(rng.uniform(0.3, 0.9)))]))
    write_json(root / "trials" / f"t{n:04d}.json", TrialRecord(id=f"t{n:04d}", number=n, status="failed", reason="x"))
    write_json(root / "trials" / f"t{n + 1:04d}.json", TrialRecord(id=f"t{n + 1:04d}", number=n + 1, status="running"))
    return root


def snapshot(exp: Path) -> dict:
    """What the report reads from digests, as plain data (NaN as its JSON text: comparable)."""
    read = read_candidates(exp, False, OBJECTIVES)
    return json.loads(json.dumps({
        "trials": [t.model_dump(mode="json") for t in read.trials], "bad": read.bad,
        "unreadable": [str(p) for p in read.unreadable],
        "replicates": {str(k): json.dumps((v[0].tolist(), v[1])) for k, v in sorted(read.replicates.items(), key=str)},
        "rungs": {k: json.dumps(list(v)) for k, v in read.rungs.items()}}))


def stamp(path: Path) -> tuple:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns, st.st_size


def count_reads(monkeypatch) -> list[str]:
    seen = []
    real = records._why
    monkeypatch.setattr(records, "_why", lambda path, model, *a: seen.append(Path(path).name) or real(path, model, *a))
    return seen


def test_the_index_is_json_lines_read_again_only_where_a_record_changed(tmp_path, monkeypatch):
    exp = experiment(tmp_path / "exp")
    cold = snapshot(exp)
    lines = (exp / INDEX).read_bytes().split(b"\n")
    assert lines[0] == b'{"format": 3}' and lines[-1] == b"" and len(lines) == 42 + 2
    assert [json.loads(line)[0] for line in lines[1:-1]] == sorted(p.name for p in (exp / "trials").glob("t*.json"))
    files = {name: (stamp(exp / name), (exp / name).read_bytes()) for name in (INDEX, INDEX_MORE)}
    seen = count_reads(monkeypatch)
    assert snapshot(exp) == cold and read_index(exp) and seen == []  # warm: no record read, nothing rewritten
    assert {name: (stamp(exp / name), (exp / name).read_bytes()) for name in (INDEX, INDEX_MORE)} == files
    # one record replaced: it alone is read again; its lines alone change
    path = exp / "trials" / "t0007.json"
    record = json.loads(path.read_text())
    record["summary"] = "changed"
    path.with_suffix(".tmp").write_text(json.dumps(record))
    path.with_suffix(".tmp").replace(path)
    again = snapshot(exp)
    assert seen == ["t0007.json"] and again["trials"][7]["summary"] == "changed"
    assert {**again, "trials": None} == {**cold, "trials": None}
    for name in (INDEX, INDEX_MORE):
        old, new = files[name][1].split(b"\n"), (exp / name).read_bytes().split(b"\n")
        assert [i for i, (a, b) in enumerate(zip(old, new)) if a != b] == [8] and len(old) == len(new)


def test_status_keeps_the_reports_lines_of_unchanged_records(tmp_path, monkeypatch):
    """status reads and rewrites index.json only; the lines of index.more.json it did not
    read stay, so the report after it reads no record again."""
    exp = experiment(tmp_path / "exp")
    cold = snapshot(exp)
    path = exp / "trials" / "t0002.json"
    path.with_suffix(".tmp").write_text(path.read_text())
    path.with_suffix(".tmp").replace(path)  # a new inode: changed
    seen = count_reads(monkeypatch)
    assert len(read_index(exp)) == 42 and seen == ["t0002.json"]  # status's reader: the brief index
    assert snapshot(exp) == cold and seen == ["t0002.json"]


def _damage(exp: Path, how: str) -> None:
    brief, more = (exp / INDEX).read_bytes().split(b"\n"), (exp / INDEX_MORE).read_bytes().split(b"\n")
    if how == "garbage line":
        brief[5] = b"{not json"
    elif how == "torn end":
        (exp / INDEX_MORE).write_bytes(b"\n".join(more)[:-300])
        return
    elif how == "out of order":
        brief[3], brief[9] = brief[9], brief[3]
    elif how == "duplicate name":
        brief.insert(4, brief[4])
    elif how == "a record that is not there":
        line = json.loads(brief[2])
        line[0] = "t0001x.json"
        brief.insert(3, json.dumps(line).encode())
    elif how == "not a list":
        brief[6] = b'{"a": 1}'
    elif how == "name not a string":
        brief[6] = b'[7, [1, 2, 3], {}]'
    elif how == "a digest that is not one":  # the version matches: only the reader can tell
        for i in (4, 8, 12):
            line = json.loads(more[i])
            line[2]["rungs"] = "x" if i == 4 else [[10, "high"]] if i == 8 else [{"step": 10, "quality": 0.1}]
            more[i] = json.dumps(line).encode()
        line = json.loads(brief[6])
        line[2]["points"] = [{"k": None, "values": "nope"}]
        brief[6] = json.dumps(line).encode()
        line = json.loads(brief[7])
        line[2]["reps"] = [[0, 0, "complete", [[None, {"acc": [1]}]]]]
        brief[7] = json.dumps(line).encode()
        line = json.loads(more[9])
        line[2]["rungs"] = [[10 ** 400, 0.5]]  # an int, too large for a float
        more[9] = json.dumps(line).encode()
        for i, point in ((10, {"k": None}), (11, {"values": {"acc": 0.5}})):  # status reads k and values
            line = json.loads(brief[i])
            line[2]["points"] = [point]
            brief[i] = json.dumps(line).encode()
    elif how == "format 2":
        (exp / INDEX).write_text(json.dumps({"format": 2, "trials": {}}))
        return
    elif how == "empty":
        (exp / INDEX_MORE).write_bytes(b"")
        return
    elif how == "no header":
        brief = brief[1:]
    (exp / INDEX).write_bytes(b"\n".join(brief))
    (exp / INDEX_MORE).write_bytes(b"\n".join(more))


@pytest.mark.parametrize("how", ["garbage line", "torn end", "out of order", "duplicate name",
                                 "a record that is not there", "not a list", "name not a string",
                                 "a digest that is not one", "format 2", "empty", "no header"])
def test_a_damaged_index_is_read_around_and_rewritten_as_a_cold_read_writes_it(tmp_path, how):
    from runners.cli.status import status_data

    exp = experiment(tmp_path / "exp")
    cold, status = snapshot(exp), status_data(exp)
    written = {name: (exp / name).read_bytes() for name in (INDEX, INDEX_MORE)}
    _damage(exp, how)
    assert snapshot(exp) == cold  # the report's reader
    assert {name: (exp / name).read_bytes() for name in (INDEX, INDEX_MORE)} == written
    _damage(exp, how)
    assert status_data(exp) == status  # status's
    assert (exp / INDEX).read_bytes() == written[INDEX]


def test_a_record_whose_name_is_not_utf8_is_read_once_and_its_line_kept(tmp_path, monkeypatch):
    """os.scandir gives such a name with a lone surrogate, which the line escapes and
    pydantic's parser refuses: json's reads it, so the index is not rewritten on every read."""
    exp = experiment(tmp_path / "exp", n=4)
    record = json.loads((exp / "trials" / "t0001.json").read_text())
    with open(os.path.join(os.fsencode(exp / "trials"), b"t\xff.json"), "w") as f:
        f.write(json.dumps({**record, "id": "t9999", "number": 9999}))
    assert len(read_index(exp, more=True)) == 7
    before = stamp(exp / INDEX)
    seen = count_reads(monkeypatch)
    assert len(read_index(exp)) == 7 and read_candidates(exp, False, OBJECTIVES).trials[-1].id == "t9999"
    assert seen == [] and stamp(exp / INDEX) == before


def test_records_from_digests_share_their_field_names_and_stay_records(tmp_path):
    exp = experiment(tmp_path / "exp", n=6)
    digests = read_index(exp, more=True)
    a, b = records.undigest(digests[0], more=True), records.undigest(digests[1], more=True)
    assert a.__pydantic_fields_set__ is b.__pydantic_fields_set__
    assert a.points[0].__pydantic_fields_set__ is b.points[0].__pydantic_fields_set__
    own = copy.deepcopy(a)  # the same record with sets of its own
    assert type(own.__pydantic_fields_set__) is set and own == a == TrialRecord.model_validate(a.model_dump())
    assert a.model_dump(exclude_unset=True) == own.model_dump(exclude_unset=True) != a.model_dump()
    changed = a.model_copy(update={"status": "failed", "arch": {"x": 1}})
    assert changed.status == "failed" and "arch" in changed.model_fields_set and "arch" not in a.model_fields_set
    a.status = "running"  # a field the digest gave: as any record
    assert a.status == "running" and b.status == "complete"
    with pytest.raises(TypeError, match="model_copy"):
        a.arch = {"x": 1}  # one it did not: the shared set is not changed for every record
    assert "arch" not in b.model_fields_set


def test_the_report_from_digests_equals_the_report_from_records(tmp_path, monkeypatch):
    """Elastic points, rungs, a cost-sheet objective, a failed and a running record: the
    digests' rows, front, p_front, ties, knee, hypervolume and rank agreement are the
    records' own."""
    import runners.report.data as data

    exp = experiment(tmp_path / "exp", n=60)
    whole = data.load(exp)
    monkeypatch.setattr(data, "WHOLE", 0)
    digests = data.load(exp)
    assert len(whole.rows) == 60 + 12 and whole.rungs is None and digests.rungs is not None
    assert all(np.isfinite(r.values["kv_bytes"]) for r in whole.rows)
    assert [(r.label, r.values, r.se, r.n, r.p_front, r.tied, r.sheet) for r in digests.rows] == \
        [(r.label, r.values, r.se, r.n, r.p_front, r.tied, r.sheet) for r in whole.rows]
    assert digests.front == whole.front and digests.knee == whole.knee and digests.noise == whole.noise
    assert any(r.p_front is not None and 0 < r.p_front < 1 for r in whole.rows)
    assert data.hypervolume_history(digests) == data.hypervolume_history(whole)
    agreement = data.rank_agreement(whole)
    assert [a.step for a in agreement] == [10, 20] and agreement[1].trials == 59  # t0003's step 20 has no quality
    assert data.rank_agreement(digests) == agreement
    assert digests.counts == whole.counts and digests.excluded == whole.excluded


def test_the_report_is_written_in_parts_atomically(tmp_path):
    from runners.checkpoint import write_text

    path = tmp_path / "page.html"
    write_text(path, ["<a>", "ü" * 3, "</a>"])
    assert path.read_text(encoding="utf-8") == "<a>üüü</a>" and os.listdir(tmp_path) == ["page.html"]
    write_text(path, "plain")
    assert path.read_text() == "plain"
