"""Data: raw Criteo parsing, synthetic data, feature encoding and batching (no Kedro inside)."""
