"""Data: raw Criteo parsing, synthetic data, feature encoding and batching (no Kedro inside)."""

# What the preprocessing workers run: imported once by the forkserver that forks them (``common.parallel``),
# not by each worker (about 0.7 s each).
WORKER_MODULES = (
    "criteo_dlrm.data.raw.days",
    "criteo_dlrm.data.metadata",
    "criteo_dlrm.data.encoding",
    "criteo_dlrm.data.shuffle",
)
