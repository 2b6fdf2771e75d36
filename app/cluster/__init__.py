"""Scale-out on Ray Serve (`voxmux serve --ray`, the `voxmux[ray]` extra).

The same app runs in an ingress deployment (`ingress.py`: routes, planning, cache, joins, encoders,
framings, the Studio); the one step that differs is where segments are rendered: a job's render
session becomes one streaming call to the engine deployment (`engines.py`), whose replicas hold
models through Serve's multiplexing (`@serve.multiplexed`) and render with the single-process
`LocalRenderer` (lanes, leases, turns, cancellable engine calls). Engine replicas report what they
hold to a small board deployment (`board.py`) that the status routes read. `app.py` builds the
Serve application; `launch.py` starts or joins a cluster and runs it. Nothing outside this package
imports Ray.
"""
