"""``specdec serve``: an OpenAI-compatible HTTP server (chat and text completions, streaming, metrics).

Argument parsing and printing only; the server lives in :mod:`specdec.server`.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..drafters.model import DEFAULT_CALL_DRAFT_WINDOW
from ..models.prefix import DEFAULT_CACHE_GB, check_cache_gb
from ..sampling import SamplingParams
from . import options

DESCRIPTION = """\
Serve speculative decoding behind the OpenAI API, for editors, agents, curl and the openai
Python client: GET /v1/models, POST /v1/chat/completions (the model's chat template), POST
/v1/completions (raw prompt), streaming as server-sent events; GET /health (200 once the models
are loaded, 503 before) and GET /metrics (Prometheus); GET /explorer: the explorer's page
(its figures, and a live view on the served pair, through the same engine). The options below set the defaults of
requests that leave a field out; a request may choose its drafter and γ with the extra body field
"speculative": {"draft": "lookup+model", "gamma": "auto"}, and every answer carries its figures
(α, tokens per target call, mean γ, drafted, accepted) in the extra field "specdec".
Every engine step runs one round of every active request, their draft calls and their verification
each in one shared model call; a prompt that starts as an earlier one did reads only the rest (the
prefix cache, --cache-gb); a full queue answers 429. It listens on this machine only
unless --host says otherwise, and answers only requests addressed to it by an allowed name
(--allowed-host) from its own pages or --allow-origin ones; --api-key (or SPECDEC_API_KEY)
makes every route but /health (and the explorer's page) ask for "Authorization: Bearer KEY".
Ctrl-C or SIGTERM stops it gracefully."""

EPILOG = """\
examples:
  specdec serve                          default pair on http://127.0.0.1:8000/v1
  specdec serve --toy --port 8001        the eight-word toy pair, no download
  specdec serve --draft lookup+model --gamma auto --temperature 0
  specdec serve --draft history+lookup+model --history-file ~/.cache/specdec/history.bin
  SPECDEC_API_KEY=s3cret specdec serve --host 0.0.0.0 --allowed-host gpu-box.lan
  specdec serve --replicas 2 --threads 1  two replicas behind Ray Serve, routed by prefix (the ray extra)
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \\
       -d '{"messages": [{"role": "user", "content": "Write a prime test in Python."}]}'"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API with speculative decoding",
                              description=DESCRIPTION, epilog=EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    net = p.add_argument_group("server")
    net.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this "
                     "machine only; another address lets other machines use it)")
    net.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    net.add_argument("--toy", action="store_true", help="serve the eight-word toy pair (tests and demos)")
    net.add_argument("--served-model-name", action="append", default=None, metavar="NAME",
                     help="a model name requests may give, repeatable (default: specdec, and the target's "
                     "file or directory name)")
    net.add_argument("--max-active", type=int, default=8, metavar="N",
                     help="requests generating at once, one round each per engine step, batched (default: %(default)s)")
    net.add_argument("--max-waiting", type=int, default=16, metavar="N",
                     help="requests queued beyond those; one more is answered 429 (default: %(default)s)")
    net.add_argument("--cache-gb", type=float, default=DEFAULT_CACHE_GB, metavar="GB",
                     help="prefix cache: the prompt-read KV of earlier requests kept in up to GB gigabytes (target's "
                     "and draft's together, least recently used evicted), so a request that starts as an earlier "
                     "one did (the same file, a longer conversation) reads only the rest; 0 turns it off "
                     "(default: %(default)s)")
    net.add_argument("--max-body-bytes", type=int, default=1_000_000, metavar="N",
                     help="largest request body accepted, else 413 (default: %(default)s)")
    net.add_argument("--log-level", default="warning", choices=("debug", "info", "warning", "error"),
                     help="uvicorn's log level; info logs every request (default: %(default)s)")
    net.add_argument("--log-steps", action="store_true",
                     help="print every engine step's plan to stderr, one line each: each job's γ, the prompt "
                     "chunk read, the draft calls, and the one target call with each job's rows, each with its "
                     "milliseconds, and the step's")
    add_guard_options(net)
    ray = p.add_argument_group("replicas on Ray Serve (the ray extra; docs/serving.md)")
    ray.add_argument("--replicas", type=int, default=0, metavar="N",
                     help="serve N replicas behind Ray Serve's HTTP proxy on --host:--port, each one engine with "
                     "its own models (--threads each), threads and prefix cache, started on a local Ray instance "
                     "(0: one process, no Ray; default: %(default)s)")
    ray.add_argument("--router", default="prefix", choices=("prefix", "pow2"),
                     help="with --replicas: prefix = a request goes to the replica that read the longest start "
                     "of its prompt, unless the replicas' queues differ by more than --imbalance (Ray's "
                     "PrefixCacheAffinityRouter); pow2 = the shorter queue of two random replicas (default: "
                     "%(default)s)")
    ray.add_argument("--imbalance", type=int, default=1, metavar="N",
                     help="with --router prefix: queue lengths further apart than N route by load alone "
                     "(default: %(default)s)")
    ray.add_argument("--cpus-per-replica", type=float, default=None, metavar="N",
                     help="CPUs Ray reserves per replica (default: --threads, else 1)")
    models = p.add_argument_group("models")
    options.add_model_options(models)
    options.add_drafter_options(models, history=True)
    models.add_argument("--call-draft-window", type=options.window_value("--call-draft-window", "as --draft-window"),
                        default=DEFAULT_CALL_DRAFT_WINDOW,
                        metavar="W", help="a draft model reads only about the last W prompt tokens when the reply must "
                        "be tool calls (tool_choice required or a named function: short, its structure the "
                        "grammar's), never more than --draft-window; 0 = as --draft-window (default: %(default)s)")
    options.add_history_options(models, serving=True)
    dec = p.add_argument_group("request defaults")
    options.add_gamma_option(dec)
    dec.add_argument("--max-tokens", type=int, default=256, metavar="N",
                     help="max_tokens of a request that gives none, cut to the context left (default: %(default)s)")
    options.add_sampling_options(dec, seed_help="seed of a request that gives none; omitted = a fresh random "
                                 "seed per request")
    p.set_defaults(run=run, seed=None)


def add_guard_options(group) -> None:
    """--allowed-host, --allow-origin, --api-key: who may ask (``server.guard``); explore has them too."""
    group.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                       help="a name requests may address this server by (the Host header), repeatable; "
                       "127.0.0.1, localhost, ::1 and the --host address always are (others get 403)")
    group.add_argument("--allow-origin", action="append", default=[], metavar="ORIGIN",
                       help="a web origin (e.g. http://localhost:3000) whose pages may call this server, "
                       "with CORS; repeatable (default: none but the server's own)")
    group.add_argument("--api-key", action="append", default=None, metavar="KEY",
                       help="require 'Authorization: Bearer KEY' on every route but /health and the "
                       "explorer's page and scripts, which then ask for it; repeatable, one key per client: each "
                       "key is a tenant of its own, and the history drafter never drafts from one tenant's text "
                       "for another (default: the SPECDEC_API_KEY environment variable, else no key)")


def guard_settings(args: argparse.Namespace):
    """The ``GuardSettings`` of the parsed options (ValueError for a bad origin or an empty key)."""
    from ..server.guard import GuardSettings

    keys = list(args.api_key or ())
    if not keys and os.environ.get("SPECDEC_API_KEY"):
        keys = [os.environ["SPECDEC_API_KEY"]]
    return GuardSettings.for_bind(args.host, allowed_hosts=args.allowed_host, allowed_origins=args.allow_origin,
                                  api_key=keys[0] if keys else None, api_keys=keys[1:])


def listen_or_explain(host: str, port: int):
    """``runner.listen``, or ValueError in one line (with a hint when the port is taken)."""
    from ..server.runner import listen

    try:
        return listen(host, port)
    except OSError as err:
        hint = " (pick another with --port, or --port 0 for any free one)" if err.errno in (98, 48, 10048) else ""
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}{hint}") from err


def run(args: argparse.Namespace) -> int:
    from ..explorer import add_explorer
    from ..server import create_app
    from ..server.guard import exposure_warning
    from ..server.runner import serve

    config, settings = server_parts(args)
    if args.replicas:
        from .serve_ray import run_replicas

        return run_replicas(args, config, settings)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    if args.toy:
        from ..models.toy import ToyPair

        app = create_app(config, pair=ToyPair())
    else:
        from .. import session

        session.set_threads(args.threads)
        app = create_app(config, load=lambda: session.load(settings, log=log))
    add_explorer(app)  # the explorer's page at /explorer, on the same server (and its guard)
    sock = listen_or_explain(args.host, args.port)
    if (warning := exposure_warning(args.host, config.guard)) is not None:
        log(warning)
    base = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{sock.getsockname()[1]}"
    log(f"specdec serve: {base}/v1 (models: {', '.join(config.model_names)}; "
        f"{'toy pair' if args.toy else '/health says 200 once the models are loaded'}; Ctrl-C stops)")
    log(f"the explorer's page: {base}/explorer")
    try:
        serve(app, args.host, sock.getsockname()[1], log_level=args.log_level, sock=sock)
    finally:
        sock.close()
    return 0


def server_parts(args: argparse.Namespace):
    """The checked ``ServeConfig`` of the parsed options, and the pair's ``LoadSettings`` (None: --toy)."""
    from .. import session
    from ..server import ServeConfig

    check_server_args(args)
    guard = guard_settings(args)
    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p)
    if not args.toy:
        options.check_model_options(args)  # a bad model, device or drafter: one line, before loading
    # The default drafts first from the server's earlier answers (agents re-send and re-write the same text: tool
    # answers 1.46x -> see docs/speed.md), then as generate's default does.
    draft = (args.draft or "history+model") if args.toy else options.drafter_value(args, history=True)
    defaults = session.RunSettings(gamma=args.gamma, max_new_tokens=args.max_tokens, sampling=sampling,
                                   seed=args.seed, draft=draft, draft_window=args.draft_window)
    defaults.validate()
    history_tokens = options.history_budget(args, draft)  # a bad file: one line, before loading
    config = ServeConfig(model_names=tuple(args.served_model_name or model_names(args)), defaults=defaults,
                         max_active=args.max_active, max_waiting=args.max_waiting,
                         max_body_bytes=args.max_body_bytes, guard=guard, log_steps=args.log_steps,
                         history_tokens=history_tokens, history_file=args.history_file,
                         call_draft_window=args.call_draft_window)
    settings = None if args.toy else options.load_settings(args, draft, cache_gb=args.cache_gb)
    return config, settings


def check_server_args(args: argparse.Namespace) -> None:
    check_cache_gb(args.cache_gb, "--cache-gb")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is invalid: must be in [0, 65535]")
    for name in ("max_active", "max_waiting", "max_body_bytes", "max_tokens", "replicas", "imbalance"):
        low = 0 if name in ("max_waiting", "replicas", "imbalance") else 1
        value = getattr(args, name, low)
        if value < low:
            raise ValueError(f"--{name.replace('_', '-')} {value} is invalid: must be an integer >= {low}")


def model_names(args: argparse.Namespace) -> list[str]:
    """specdec, and the target's file or directory name without its extension."""
    if args.toy:
        return ["specdec-toy", "specdec"]
    names = ["specdec"]
    if args.target:
        names.append(os.path.splitext(os.path.basename(os.path.normpath(args.target)))[0])
    return names
