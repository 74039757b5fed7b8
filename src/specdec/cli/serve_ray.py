"""``specdec serve --replicas N``: the replicas on a local Ray instance, and ``build``, the application
builder that ``serve run deploy/ray-serve.yaml`` calls on a Ray cluster (the same options as a list).

Argument parsing and printing only; the application lives in :mod:`specdec.server.replicas`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

# Serve's background work, slowed for one machine, where its CPU is taken from the replicas' (2 cores: ~10% of a
# throughput run went to Ray's own processes, benchmarks/results/serve-replicas.md): the controller's loop (Ray's
# default 0.1 s: a dead replica is noticed within 0.5 s instead) and the metrics' export (0.1 s by default).
QUIET_RAY = {"RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "0.5", "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "1000"}


def ray_settings(args: argparse.Namespace):
    """The ``RaySettings`` of the parsed options (ValueError naming a bad value)."""
    from ..server.replicas import RaySettings

    cpus = args.cpus_per_replica if args.cpus_per_replica is not None else float(args.threads or 1)
    if not cpus >= 0:
        raise ValueError(f"--cpus-per-replica {cpus} is invalid: must be a number >= 0")
    return RaySettings(replicas=max(1, args.replicas), router=args.router, imbalance=args.imbalance,
                       cpus_per_replica=cpus).validate()


def replica_settings(args: argparse.Namespace, config, settings):
    from ..server.replicas import ReplicaSettings

    return ReplicaSettings(config=config, load=settings, threads=args.threads)


def run_replicas(args: argparse.Namespace, config, settings) -> int:
    """Start Ray here (one CPU per replica's reservation at least), the replicas, then wait for Ctrl-C."""
    try:
        import ray
        from ray import serve
    except ImportError as err:
        raise ValueError("--replicas needs Ray Serve: pip install 'specdec[ray]'") from err
    from ..server.replicas import start

    r = ray_settings(args)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    cpus = max(os.cpu_count() or 1, int(r.replicas * r.cpus_per_replica + 0.999))
    for name, value in QUIET_RAY.items():  # before Ray starts: its processes inherit them (a user's own win)
        os.environ.setdefault(name, value)
    ray.init(num_cpus=cpus, include_dashboard=False)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        start(replica_settings(args, config, settings), r, host=args.host, port=args.port)
        base = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{args.port}"
        log(f"specdec serve: {base}/v1 ({r.replicas} replicas on Ray Serve, router {r.router}; "
            f"models: {', '.join(config.model_names)}; Ctrl-C stops)")
        while not stop.wait(1.0):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
    return 0
