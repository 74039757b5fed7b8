"""``specdec explore``: serve the explorer page (the spec's figures and a live view) on this machine.

Argument parsing and printing only; the routes live in :mod:`specdec.explorer`, and uvicorn runs them
(:mod:`specdec.server.runner`) as it runs ``specdec serve``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import webbrowser

from . import options
from .serve import add_guard_options, guard_settings, listen_or_explain

DESCRIPTION = """\
Start a local web server with four views of speculative decoding, all computed by
the specdec engine: one round on a toy pair of bigram models (draft, verify,
repeat), the acceptance rule run 10,000 times on the worked example, the choice
of γ from the paper's formulas, and live generation from a model pair with each
token coloured by where it came from.

The server listens on the loopback address only, unless --host says otherwise,
and answers only requests addressed to it by an allowed name (--allowed-host)
from its own page or --allow-origin ones; --api-key (or SPECDEC_API_KEY) makes
the API ask for the key (the page asks you for it once).
The live view loads the model pair the first time it is used (--toy: the toy
pair, no download, instant)."""

EPILOG = """\
examples:
  specdec explore --open              the page in your browser, default pair for Live
  specdec explore --toy --port 8000   everything on the eight-word toy pair"""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "explore",
        help="serve an interactive page: toy rounds, 10,000 draws, choosing γ, live generation",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8765,
                   help="port to listen on, 0 for any free one (default: %(default)s)")
    p.add_argument("--open", action="store_true", help="open the page in a web browser")
    p.add_argument("--toy", action="store_true",
                   help="run the live view on the eight-word toy pair instead of real models")
    models = p.add_argument_group("models for the live view (loaded when it is first used)")
    options.add_model_options(models, include=("target", "draft_model", "device", "dtype", "dequantize"))
    p.add_argument("--verbose", action="store_true", help="log every request to standard error")
    add_guard_options(p.add_argument_group("who may ask"))
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..explorer import create_app, make_explorer
    from ..server.guard import exposure_warning
    from ..server.runner import serve

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is invalid: must be in [0, 65535]")
    guard = guard_settings(args)
    draft = None
    if not args.toy:
        options.check_model_options(args)  # a bad model or device: one line now, not when Live is first used
        draft = options.drafter_value(argparse.Namespace(draft="model", draft_model=args.draft_model))
        draft = None if draft == "model" else draft
    sock = listen_or_explain(args.host, args.port)
    explorer = make_explorer(toy=args.toy, target=args.target, draft=draft, device=args.device,
                             dtype=None if args.dtype == "auto" else args.dtype, dequantize=args.dequantize)
    app = create_app(explorer, guard=guard)
    if (warning := exposure_warning(args.host, guard)) is not None:
        print(warning, file=sys.stderr)
    host = f"[{args.host}]" if ":" in args.host else args.host
    url = f"http://{host}:{sock.getsockname()[1]}/"
    live = "the toy pair" if args.toy else "the model pair (loaded when Live is first used)"
    print(f"specdec explorer at {url}  (live view: {live}; Ctrl-C stops)", flush=True)
    if args.open:
        threading.Timer(0.5, webbrowser.open, args=(url,)).start()
    try:
        serve(app, args.host, sock.getsockname()[1], log_level="info" if args.verbose else "warning", sock=sock)
    except KeyboardInterrupt:  # uvicorn has shut down gracefully, then passes Ctrl-C on
        print("stopped", file=sys.stderr)
    finally:
        sock.close()
    return 0
