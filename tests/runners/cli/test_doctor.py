"""``loopnas doctor``: the torch build, GPUs, package versions, and whether fla can run here."""
import json

import torch

from runners.cli import main
from runners.cli.doctor import PACKAGES


def test_doctor_json_reports_this_machine(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["packages"]) == set(PACKAGES)
    assert report["packages"]["torch"] == torch.__version__
    assert report["cuda_available"] == torch.cuda.is_available()
    if torch.version.cuda:
        assert report["torch_build"] == f"CUDA {torch.version.cuda}"
    if not torch.cuda.is_available():  # CI: no GPU, no interpreter
        assert report["fla_backend"].startswith("not usable: fla's Triton kernels need a CUDA device")
        assert report["auto_backend"] == "torch" and "fla_kernels" not in report


def test_doctor_table_names_every_package(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert all(dist in out for dist in PACKAGES) and "fla backend" in out and "backend=auto" in out
