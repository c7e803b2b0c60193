"""Training and evaluation machinery (plain PyTorch, no Kedro inside)."""
