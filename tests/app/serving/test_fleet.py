"""One view of each model over every engine replica's report."""

from __future__ import annotations

from app.serving.fleet import ReplicaModel, ReplicaState, fleet_views
from engines.registry import ModelStatus


def model(status: ModelStatus, **counts: int) -> ReplicaModel:
    return ReplicaModel(status=status, refcount=counts.get("refcount", 0),
                        error="weights missing" if status is ModelStatus.ERROR else None,
                        load_seconds=0.5, running=counts.get("running", 0),
                        queued=counts.get("queued", 0), in_flight=counts.get("in_flight", 0))


def test_a_model_is_as_ready_as_its_best_replica_and_counts_add_up() -> None:
    replicas = [
        ReplicaState("a", "node-1", {"piper": model(ModelStatus.READY, running=1, queued=2),
                                     "kokoro": model(ModelStatus.ERROR)}),
        ReplicaState("b", "node-2", {"piper": model(ModelStatus.LOADING, queued=1),
                                     "espeak": model(ModelStatus.READY, in_flight=1)}),
    ]
    views = fleet_views(["piper", "kokoro", "espeak", "other"], replicas)
    assert views["piper"].status is ModelStatus.READY and views["piper"].replicas == ("a", "b")
    assert (views["piper"].running, views["piper"].queued) == (1, 3)
    assert views["kokoro"].status is ModelStatus.ERROR
    assert views["kokoro"].error == "weights missing" and views["kokoro"].replicas == ()
    assert views["espeak"].in_flight == 1 and views["espeak"].replicas == ("b",)
    assert views["other"].status is ModelStatus.UNLOADED and views["other"].replicas == ()
    assert replicas[1].holds == ["piper", "espeak"]
