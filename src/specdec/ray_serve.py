"""``serve run deploy/ray-serve.yaml``'s entry point: ``specdec serve``'s options, parsed by the CLI, into the Ray
Serve application of ``specdec.server.replicas`` (kept outside ``specdec.cli``, which it imports: the CLI's modules
never import it, so no import loop).
"""

from __future__ import annotations


def build(app_args: dict):
    """``serve run``'s application builder: ``args: {argv: [...]}`` are ``specdec serve``'s options
    (``--replicas``, ``--router``, the models, the request defaults); --host and --port are the
    cluster's (Serve's ``http_options``), not these."""
    from .cli import build_parser
    from .cli.serve import server_parts
    from .cli.serve_ray import ray_settings, replica_settings

    argv = app_args.get("argv", [])
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"argv={argv!r} is invalid: must be a list of strings (specdec serve's options)")
    args = build_parser().parse_args(["serve", *argv])
    config, settings = server_parts(args)
    from .server.replicas import application

    return application(replica_settings(args, config, settings), ray_settings(args))
