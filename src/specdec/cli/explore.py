"""``specdec explore``: serve the explorer page (the spec's figures and a live view) on this machine.

Argument parsing and printing only; the server lives in :mod:`specdec.explorer`.
"""

from __future__ import annotations

import argparse
import sys
import threading
import webbrowser

DESCRIPTION = """\
Start a local web server with four views of speculative decoding, all computed by
the specdec engine: one round on a toy pair of bigram models (draft, verify,
repeat), the acceptance rule run 10,000 times on the worked example, the choice
of γ from the paper's formulas, and live generation from a model pair with each
token coloured by where it came from.

The server listens on the loopback address only, unless --host says otherwise.
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
    p.add_argument("--target", default=None, metavar="MODEL",
                   help="target model for the live view: a GGUF file or transformers model "
                   "directory (default: the default pair)")
    p.add_argument("--draft", default=None, metavar="MODEL",
                   help="draft model for the live view (default: the default pair's draft)")
    p.add_argument("--device", default="cpu", help="device for the live view's models (default: %(default)s)")
    p.add_argument("--dtype", default=None,
                   help="weights dtype for the live view: float32, bfloat16, float16 (default: auto, float32 on CPU)")
    p.add_argument("--verbose", action="store_true", help="log every request to standard error")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..explorer import make_server

    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port {args.port} is invalid: must be in [0, 65535]")
    try:
        server = make_server(args.host, args.port, toy=args.toy, target=args.target, draft=args.draft,
                             device=args.device, dtype=args.dtype, verbose=args.verbose)
    except OSError as err:
        hint = " (pick another with --port, or --port 0 for any free one)" if err.errno in (98, 48, 10048) else ""
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {err.strerror or err}{hint}") from err
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: listening on {args.host}: other machines on the network can use this server",
              file=sys.stderr)
    live = "the toy pair" if args.toy else "the model pair (loaded when Live is first used)"
    print(f"specdec explorer at {server.url}  (live view: {live}; Ctrl-C stops)", flush=True)
    if args.open:
        threading.Timer(0.3, webbrowser.open, args=(server.url,)).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    finally:
        server.live.stopping.set()
        server.server_close()
    return 0
