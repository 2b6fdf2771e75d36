"""Engine replicas' reports as Ray's metrics endpoint exports them, read back by the ingress."""

from __future__ import annotations

import time

from app.cluster.reports import STALE_SECONDS, STATUSES, parse
from engines.registry import ModelStatus


def exported(replica: str, seen: float, model: str, status: ModelStatus, refcount: int,
             deployment: str = "VoxMuxEngines") -> str:
    tags = f'application="voxmux",deployment="{deployment}",replica="{replica}",node="n1"'
    return "\n".join([
        "# TYPE ray_voxmux_replica_seen_seconds gauge",
        f"ray_voxmux_replica_seen_seconds{{{tags}}} {seen}",
        "# TYPE ray_voxmux_replica_model gauge",
        f'ray_voxmux_replica_model{{{tags},model="{model}",field="status"}} '
        f"{STATUSES.index(status)}",
        f'ray_voxmux_replica_model{{{tags},model="{model}",field="refcount"}} {refcount}',
        f'ray_voxmux_replica_model{{{tags},model="{model}",field="draining"}} 1',
        # the model's providers by rank; one it ran on before a reload is 0
        *(f'ray_voxmux_replica_model{{{tags},model="{model}",field="provider:{name}"}} {rank}'
          for name, rank in (("CPUExecutionProvider", 2), ("CUDAExecutionProvider", 1),
                             ("TensorrtExecutionProvider", 0))),
        "",
    ])


def test_live_replicas_of_the_deployment_are_read_back() -> None:
    now = time.time()
    texts = [
        exported("a", now, "piper", ModelStatus.READY, 2),
        exported("b", now - STALE_SECONDS - 1, "piper", ModelStatus.READY, 0),  # gone
        exported("c", now, "piper", ModelStatus.READY, 0, deployment="Other"),
        exported("d", now, "espeak", ModelStatus.UNLOADED, 0),  # holds nothing
    ]
    replicas = parse(texts, "voxmux", {"VoxMuxEngines"})
    assert [r.id for r in replicas] == ["a", "d"]
    (piper,) = replicas[0].models.values()
    assert replicas[0].holds == ["piper"] and replicas[0].node == "n1"
    assert piper.status is ModelStatus.READY and piper.refcount == 2 and piper.draining
    assert piper.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert replicas[1].models == {}
