"""Templates copied verbatim into every export directory (never imported from here: their
relative imports name the flat modules that :mod:`runners.export.vendor` writes next to them).
A package only so that a wheel ships them."""
