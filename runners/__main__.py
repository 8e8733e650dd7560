from runners.cli import _entry

_entry()
