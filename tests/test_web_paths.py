"""One web path: no value a client sends is ever used as a path, or checked against the filesystem.

A table of hostile drafter values goes to the OpenAI route and to the explorer's live view (of
``specdec serve``, on the server's engine, and of ``specdec explore``, on its own): each is one 400
whose message is the same for every value once the value itself is taken out (so the answer never
tells whether some path exists), while a watch (``os.stat`` / ``os.lstat`` / ``numpy.load`` patched,
and an audit hook on ``open``, ``os.listdir``, ``os.scandir``) sees no filesystem call on any of them.
The server's own ``--draft`` (an operator's n-gram table) stays usable, by that exact value only.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import threading
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from conftest import start_explorer

from specdec.choices import FILELESS_FORMS, parse_draft, parse_fileless_draft
from specdec.explorer import add_explorer
from specdec.models.ngram import NgramModel
from specdec.models.toy import TOY_WORDS, ToyPair
from specdec.server import ServeConfig
from specdec.server import create_app as create_serve_app
from specdec.server.prepare import shown
from specdec.server.runner import ServerThread
from specdec.session import RunSettings

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTILE = [
    "model:/etc", "model:/nonexistent", "model:/etc/passwd", "model:/nonexistent/passwd", "ngram:/etc/shadow",
    "ngram:/nonexistent/shadow", "model:~/.cache/specdec", "model:~/.nonexistent", "venv", ".venv", "nothere",
    "x/\ud800", "../../etc", "../../nonexistent", "/tmp", "/nonexistent", "lookup+ngram:/etc/passwd",
    "lookup+ngram:/nonexistent", "bigram:/etc/hostname", "lookup+model:/etc", "model:", "ngram", "lookup:/etc",
    "Model", "tests/conftest.py", os.path.join(HERE, "conftest.py"), "/etc/passwd", "pyproject.toml",
    "model:" + "/a" * 12_000, "A" * 30_000, "ngram:" + "../" * 5_000 + "etc/passwd",
]


def paths_of(value: str) -> set[str]:
    """What a server that used ``value`` as a path would look at: the value, what follows a form's
    ':' or 'lookup+', each with ~ expanded and made absolute."""
    raw = {value, value.strip(), value.partition(":")[2], value.removeprefix("lookup+")}
    return {normal(p) for p in raw if p}


def normal(path) -> str:
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    return os.path.normpath(os.path.abspath(os.path.expanduser(str(path))))


class Watch:
    """The paths this process looks at while ``watching`` (any thread): stat, lstat, np.load, and the
    audit events of open / os.listdir / os.scandir."""

    active: Watch | None = None
    hooked = False

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.lock = threading.Lock()

    def note(self, path) -> None:
        if isinstance(path, (str, bytes, os.PathLike)):
            try:
                text = normal(os.fspath(path))
            except (TypeError, ValueError):
                return
            with self.lock:
                self.seen.append(text)

    @classmethod
    def audit(cls, event: str, args: tuple) -> None:
        watch = cls.active
        if watch is not None and event in ("open", "os.listdir", "os.scandir") and args:
            watch.note(args[0])

    @contextmanager
    def watching(self):
        if not Watch.hooked:  # an audit hook stays for the life of the process: it looks only while active
            sys.addaudithook(Watch.audit)
            Watch.hooked = True
        real_stat, real_lstat, real_load = os.stat, os.lstat, np.load

        def stat(path, *args, **kwargs):
            self.note(path)
            return real_stat(path, *args, **kwargs)

        def lstat(path, *args, **kwargs):
            self.note(path)
            return real_lstat(path, *args, **kwargs)

        def load(file, *args, **kwargs):
            self.note(file)
            return real_load(file, *args, **kwargs)

        Watch.active = self
        try:
            with mock.patch("os.stat", stat), mock.patch("os.lstat", lstat), mock.patch("numpy.load", load):
                yield self
        finally:
            Watch.active = None

    def touched(self, values) -> set[str]:
        wanted = set().union(*(paths_of(v) for v in values))
        with self.lock:
            return wanted & set(self.seen)


def post(srv, path: str, body: dict) -> tuple[int, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    raw, kind = response.read(), response.getheader("Content-Type", "")
    conn.close()
    return response.status, (json.loads(raw) if kind.startswith("application/json") else {"stream": raw.decode()})


def message(data: dict) -> str:
    """The refusal's message: the OpenAI shape ({"error": {"message"}}) or the explorer's ({"error": text})."""
    error = data["error"]
    return error["message"] if isinstance(error, dict) else error


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    """An operator's n-gram table (``specdec serve --draft ngram:TABLE``), and another valid one."""
    folder = tmp_path_factory.mktemp("tables")
    paths = []
    for name in ("own.ngram", "other.ngram"):
        path = folder / name
        NgramModel.fit([[0, 1, 2, 3, 0, 1, 2, 4, 5, 6, 7]], order=2, vocab_size=len(TOY_WORDS)).save(path)
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def servers(table):
    """``specdec serve`` (toy pair, explorer added: its live view on the server's engine), the same
    with ``--draft ngram:TABLE``, and ``specdec explore --toy`` (a live view on an engine of its own)."""
    apps = []
    for draft in ("model", f"ngram:{table[0]}"):
        app = create_serve_app(ServeConfig(defaults=RunSettings(draft=draft, max_new_tokens=8)), pair=ToyPair())
        add_explorer(app)
        apps.append(ServerThread(app))
    explorer = start_explorer()
    yield {"serve": apps[0], "serve-table": apps[1], "explore": explorer}
    for srv in (*apps, explorer):
        srv.stop()


ROUTES = [("serve", "/v1/chat/completions"), ("serve", "/api/live"), ("serve-table", "/v1/chat/completions"),
          ("serve-table", "/api/live"), ("explore", "/api/live")]


def body(draft) -> dict:
    return {"messages": [{"role": "user", "content": "the cat"}], "max_tokens": 4,
            "speculative": {"draft": draft}}


@pytest.mark.parametrize("server, path", ROUTES)
def test_hostile_drafter_values_get_one_answer_and_touch_no_path(servers, table, server, path):
    srv, watch = servers[server], Watch()
    values = HOSTILE + [f"ngram:{table[1]}", table[1], f"lookup+ngram:{table[1]}"]
    if server != "serve-table":
        values.append(f"ngram:{table[0]}")  # only the server whose own --draft it is takes it
    answers = {}
    with watch.watching():
        for value in values:
            answers[value] = post(srv, path, body(value))
    assert watch.touched(values) == set()
    templates = set()
    for value, (status, data) in answers.items():
        assert status == 400, (value[:80], data)
        text = message(data)
        assert shown(value) in text, (value[:80], text)
        templates.add(text.replace(shown(value), "<value>"))
        if path.startswith("/v1/"):
            assert (data["error"]["param"], data["error"]["code"]) == ("speculative.draft", "invalid_value")
    assert len(templates) == 1 and "refused" in templates.pop()


def test_the_watch_sees_a_path_being_looked_at(table):
    """The watch above can fail: the CLI's parser (an operator's value) opens the files it names."""
    watch = Watch()
    with watch.watching():
        parse_draft(f"ngram:{table[0]}")
        with pytest.raises(ValueError):
            parse_draft("ngram:/etc/shadow")
        with pytest.raises(ValueError):
            parse_draft("nothere")
    assert watch.touched([f"ngram:{table[0]}", "ngram:/etc/shadow", "nothere"]) == {
        normal(table[0]), "/etc/shadow", normal("nothere")}


@pytest.mark.parametrize("server, path", ROUTES)
def test_the_file_less_forms_and_the_servers_own_draft_are_served(servers, table, server, path):
    forms = list(FILELESS_FORMS) + [" lookup "] + ([f"ngram:{table[0]}"] if server == "serve-table" else [])
    for draft in forms:
        status, data = post(servers[server], path, body(draft))
        assert status == 200, (draft, data)
        if path == "/api/live":
            assert data["stream"].rstrip().endswith("event: end\ndata: {}"), data
        else:
            assert data["choices"][0]["message"]["content"]
    if server == "serve-table":  # the operator's table drafted: its name is in the figures
        _, data = post(servers[server], path, body(f"ngram:{table[0]}"))
        drafter = data["specdec"]["drafter"] if path.startswith("/v1/") else data["stream"]
        assert "n-gram" in drafter


def test_parse_fileless_draft_compares_names_only():
    watch = Watch()
    with watch.watching():
        assert [parse_fileless_draft(f" {name}\n").text.strip() for name in FILELESS_FORMS] == list(FILELESS_FORMS)
        assert all(parse_fileless_draft(value) is None for value in HOSTILE + [None, 5, b"model"])
    assert watch.touched(HOSTILE) == set()


def test_the_clis_hint_quotes_the_value():
    """An operator's value that is no form gets a hint naming it quoted (repr), so any character in
    it can be printed or sent as JSON (a lone surrogate once made the API answer 500)."""
    with pytest.raises(ValueError) as err:
        parse_draft("x/\ud800")
    assert "'x/\\ud800'" in str(err.value)
    str(err.value).encode("utf-8")  # no lone surrogate left in it
