"""onnxruntime's threads on an engine replica follow the CPUs Ray granted it."""

from __future__ import annotations

from app.cluster.engines import intra_op_threads


def test_threads_follow_the_replicas_cpus() -> None:
    assert intra_op_threads(0, 2.0) == 2
    assert intra_op_threads(0, 1.5) == 1  # whole CPUs: never more threads than granted
    assert intra_op_threads(0, 0.5) == 1 and intra_op_threads(0, 0.0) == 1
    assert intra_op_threads(3, 1.0) == 3  # VOXMUX_INTRA_OP_THREADS wins when set
