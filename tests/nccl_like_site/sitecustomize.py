"""Run at the start of every Python process whose PYTHONPATH holds this folder (tests.nccl_like's
``nccl_like_environment``): the NCCL-like checks for the whole process, when the test asked for them."""

import os
import sys
from pathlib import Path

if os.environ.get("CRITEO_DLRM_TEST_NCCL_LIKE") == "1":
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    from tests.nccl_like import install

    install()
