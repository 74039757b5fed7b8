"""The server's history table on the toy pair: a finished answer drafts for the next request, one tenant's
text never drafts for another's, the table outlives a restart through its file, and a bad file is refused
by name before the server starts.

The toy target's greedy text after "mat ." is "the cat sat on the cat ...", and after "dog" it is "ran on the
cat sat on the cat ...": so six tokens after "mat ." hold no 3 tokens that occurred before in that request
(its own text cannot draft), while the answer to "dog" holds "the cat sat on the". A second request that
history helps therefore shows drafts from earlier requests, accepted; one it cannot help shows none.
"""

import dataclasses
import json

import httpx
import pytest

from specdec.cli import main
from specdec.drafters import HistoryTable
from specdec.drafters.history_table import tenant_id
from specdec.models.toy import ToyPair
from specdec.sampling import SamplingParams
from specdec.server import GuardSettings, ServeConfig, create_app
from specdec.server.engine.runs import SequenceRun
from specdec.server.runner import ServerThread
from specdec.session import RunSettings

MODEL = "specdec-toy"
DEFAULTS = RunSettings(gamma=3, max_new_tokens=6, sampling=SamplingParams(temperature=0.0), seed=None,
                       draft="history")
KEY_A, KEY_B = "key-of-client-a", "key-of-client-b"


def serve(**kw):
    return ServerThread(create_app(ServeConfig(model_names=(MODEL,), defaults=DEFAULTS, **kw), pair=ToyPair()))


def complete(server, prompt: str, key: str | None = None, **extra) -> dict:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, **extra}
    response = httpx.post(server.url + "/v1/completions", content=json.dumps(body), headers=headers, timeout=20)
    assert response.status_code == 200, response.text
    return response.json()


def from_history(data: dict) -> int:
    """How many proposals of this request came from earlier requests (the drafter's description says)."""
    drafter = data["specdec"]["drafter"]
    if "history drafts:" not in drafter:
        return 0
    return int(drafter.split("from this request, ")[1].split(" from earlier ones")[0])


def test_a_second_request_drafts_from_the_first_answer_and_its_drafts_are_accepted():
    with serve(history_tokens=1000) as server:
        alone = complete(server, "mat .")
        assert alone["choices"][0]["text"].split() == ["the", "cat", "sat", "on", "the", "cat"]
        assert from_history(alone) == 0 and alone["specdec"]["accepted"] == 0  # nothing before it to copy
        complete(server, "dog", max_tokens=10)  # its answer: ran on the cat sat on the cat sat on
        helped = complete(server, "mat .")
        assert helped["choices"][0]["text"] == alone["choices"][0]["text"]  # greedy: the same text
        assert from_history(helped) > 0 and helped["specdec"]["accepted"] > 0
        assert helped["specdec"]["target_calls"] < alone["specdec"]["target_calls"]


def test_a_server_without_a_table_drafts_from_the_request_alone():
    with serve() as server:  # history_tokens 0: no table
        complete(server, "dog", max_tokens=10)
        data = complete(server, "mat .")
        assert from_history(data) == 0 and data["specdec"]["accepted"] == 0


def test_one_tenants_history_never_drafts_for_another():
    with serve(history_tokens=1000, guard=GuardSettings(api_key=KEY_A, api_keys=(KEY_B,))) as server:
        complete(server, "dog", KEY_A, max_tokens=10)
        other = complete(server, "mat .", KEY_B)
        assert from_history(other) == 0 and other["specdec"]["accepted"] == 0
        same = complete(server, "mat .", KEY_A)
        assert from_history(same) > 0 and same["specdec"]["accepted"] > 0
        assert same["choices"][0]["text"] == other["choices"][0]["text"]
        table = server.app.state.specdec.history
        assert table.tenants() == sorted([tenant_id(KEY_A), tenant_id(KEY_B)])
        assert [len(text) for _, text in table.texts(tenant_id(KEY_B))] == [2 + 6]  # prompt and answer


def test_a_request_with_its_own_seed_drafts_from_its_own_text_only():
    """Its draws must not depend on other requests' texts (OpenAI's seed), so its drafter never reads the table;
    it still feeds the table when it finishes."""
    view = HistoryTable(8).view(tenant_id(KEY_A))
    sampled = dataclasses.replace(DEFAULTS, sampling=SamplingParams(temperature=1.0), seed=3)
    seeded = SequenceRun(ToyPair(), [6, 7], dataclasses.replace(sampled, reproducible=True), history=view)
    assert seeded.drafter.history is None and seeded.history is view
    assert SequenceRun(ToyPair(), [6, 7], sampled, history=view).drafter.history is view


def test_the_table_outlives_a_restart_through_its_file(tmp_path):
    path = tmp_path / "history.bin"
    with serve(history_tokens=1000, history_file=str(path), guard=GuardSettings(api_key=KEY_A)) as server:
        complete(server, "dog", KEY_A, max_tokens=10)
    saved = HistoryTable.load(path)
    assert saved.tenants() == [tenant_id(KEY_A)] and KEY_A not in path.read_bytes().decode("latin-1")
    with serve(history_tokens=1000, history_file=str(path), guard=GuardSettings(api_key=KEY_A)) as server:
        data = complete(server, "mat .", KEY_A)
        assert from_history(data) > 0 and data["specdec"]["accepted"] > 0


def test_serve_refuses_a_bad_history_file_by_name_before_starting(tmp_path, capsys):
    bad = tmp_path / "broken.bin"
    bad.write_bytes(b"specdec-history\n{\"format\": 1}\n")
    assert main(["serve", "--toy", "--port", "0", "--history-file", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "broken.bin" in err and "not a valid specdec history table" in err


@pytest.mark.parametrize("value", ["-1", "x", str((1 << 28) + 1)])
def test_history_tokens_out_of_range_is_refused_with_the_range(value, capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--toy", "--history-tokens", value])
    assert f"--history-tokens {value!r} is invalid: an integer in [0, {1 << 28}]" in capsys.readouterr().err


def test_a_table_of_another_vocabulary_is_refused_by_name_once_the_model_is_loaded(tmp_path):
    path = tmp_path / "other.bin"
    table = HistoryTable(100)
    table.record("", [50, 60, 70])
    table.save(path)
    config = ServeConfig(model_names=(MODEL,), defaults=DEFAULTS, history_tokens=1000, history_file=str(path))
    with ServerThread(create_app(config, load=ToyPair)) as server:
        health = httpx.get(server.url + "/health", timeout=20)
        assert health.status_code == 503
        assert "other.bin" in health.text and "vocabulary of 100 tokens, and this model has 8" in health.text
    assert HistoryTable.load(path).texts() == [("", [50, 60, 70])]  # the refused file is left as it was


def test_serve_drafts_from_its_history_by_default_and_a_given_draft_is_kept(capsys):
    """`specdec serve` (and `specdec generate`) without --draft: history first (a table of the default budget),
    then the default drafter; a --draft that leaves history out keeps no table; the real pair's default is folded
    in the same way."""
    from specdec.cli import build_parser
    from specdec.cli.options import drafter_value
    from specdec.cli.serve import server_parts
    from specdec.drafters.history_table import DEFAULT_BUDGET

    parser = build_parser()
    config, _ = server_parts(parser.parse_args(["serve", "--toy"]))
    assert (config.defaults.draft, config.history_tokens) == ("history+model", DEFAULT_BUDGET)
    config, _ = server_parts(parser.parse_args(["serve", "--toy", "--draft", "model"]))
    assert (config.defaults.draft, config.history_tokens) == ("model", 0)
    assert drafter_value(parser.parse_args(["serve"]), history=True) == "history+model"
    assert drafter_value(parser.parse_args(["serve", "--draft", "lookup"]), history=True) == "lookup"
    assert drafter_value(parser.parse_args(["generate", "x"]), history=True) == "history+model"  # as generate asks
    assert drafter_value(parser.parse_args(["generate", "x"])) == "model"
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "(default: history+model, or history+lookup when" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    assert "(default: history+model, or history+lookup when" in " ".join(capsys.readouterr().out.split())
