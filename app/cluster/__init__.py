"""Scale-out on Ray Serve (`voxmux serve --ray`, the `voxmux[ray]` extra).

The same app runs in an ingress deployment (`ingress.py`: routes, planning, cache, joins, encoders,
framings, the Studio); the one step that differs is where segments are rendered: a job's render
session becomes one streaming call to the engine deployment (`engines.py`), whose replicas hold
models through Serve's multiplexing (`@serve.multiplexed`) and render with the single-process
`LocalRenderer` without admission (Serve admits and queues). Engine replicas report what they
hold through Ray's metrics (`reports.py`), which the status routes read back; cancels by id reach
the other ingress replicas through Redis (`cancels.py`). `app.py` builds the
Serve application; `launch.py` starts or joins a cluster and runs it. Nothing outside this package
imports Ray.
"""
