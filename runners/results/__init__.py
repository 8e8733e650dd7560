"""The experiment as read: its statuses, candidates, replicates, front and checkpoints.
Torch-free; ``status``, ``report``, export's ``--pick``, the progress line and calibrate read
it (issue #33)."""
