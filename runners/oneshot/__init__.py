"""One-shot search: a supernet trained once, sub-networks evaluated with its weights."""
from .check import run_check
from .remedies import Supernets, train_remedied
from .search import OneShotSearch, Scorer, extract, run_oneshot, save_subnet
from .supernet import OneShotError, load_supernet, supernet_config, train_supernet
from runners.weights import inherit, load_source

__all__ = ["OneShotSearch", "Scorer", "Supernets", "train_remedied", "extract", "run_check", "run_oneshot", "save_subnet", "OneShotError",
           "load_supernet", "supernet_config", "train_supernet", "inherit", "load_source"]
