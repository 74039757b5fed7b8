"""``specdec serve``: an OpenAI-compatible HTTP server for speculative decoding.

- ``schema``: the request bodies (pydantic); ``errors``: the OpenAI error object and input guards;
- ``prepare``: a request body → a checked ``SequenceRun`` (``engine.runs``: one request's generation, round
  by round);
- ``engine``: the package of the one thread that owns the models; each step runs one round of every request,
  their calls batched;
- ``text``: prompts in, text deltas and stop strings out; ``responses``: OpenAI objects and chunks;
- ``metrics``: Prometheus counters and histograms; ``app``: the FastAPI app and its routes;
- ``guard``: who may ask (Host allow-list, Origin check, CORS, API key), before every route;
- ``runner``: uvicorn with graceful shutdown.
"""

from .app import ServeConfig, create_app
from .guard import GuardSettings

__all__ = ["GuardSettings", "ServeConfig", "create_app"]
