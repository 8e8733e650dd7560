"""The experiment as read: its statuses (``status``), records and checkpoints (``records``),
the one front computation and order (``front``), the read-model status, report, export's
``--pick`` and calibrate read (``experiment``) and the one terminal front table (``table``).
Torch-free; the progress line ranks with the same front (issue #33)."""
