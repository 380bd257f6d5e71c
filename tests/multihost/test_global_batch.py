"""Real processes: each host's local rows land in the right rows of the global jax.Array."""

import json

import numpy as np
import pytest

from .helpers import RUN_S, run_all, worker_command
from .worker import expected_global_batch

pytestmark = pytest.mark.multiprocess

# 2 processes x 2 devices: batch over data, over fsdp, data x tensor, and the DCN (hybrid) mesh.
MESHES = [
    {"ici": {"data": -1}},
    {"ici": {"fsdp": -1}},
    {"ici": {"data": -1, "tensor": 2}},
    {"ici": {"data": 1, "fsdp": 2}, "dcn": {"data": 2}},
]
# Tensor parallelism over the processes with the batch inside each: every process would hold
# all rows, which per-process data cannot fill.
REPLICATED_ACROSS_PROCESSES = {"ici": {"data": 1, "tensor": 4}}


def test_local_rows_assemble_into_the_global_batch(tmp_path):
    meshes = json.dumps([*MESHES, REPLICATED_ACROSS_PROCESSES])
    run_all([worker_command("global_batch", str(tmp_path), meshes) for _ in range(2)],
            timeout=RUN_S)
    want = expected_global_batch(8)
    for process in range(2):
        errors = json.loads((tmp_path / f"{process}.errors.json").read_text())
        assert list(errors) == [str(len(MESHES))]
        assert "BertJaxError" in errors[str(len(MESHES))]
        assert "make the batch axes span the processes" in errors[str(len(MESHES))]
        got = np.load(tmp_path / f"{process}.npz")
        for n in range(len(MESHES)):
            assert got[f"{n}_shards_ok"], MESHES[n]
            for key, value in want.items():
                assert tuple(got[f"{n}_{key}_shape"]) == value.shape
                np.testing.assert_array_equal(got[f"{n}_{key}"], value, err_msg=str(MESHES[n]))
