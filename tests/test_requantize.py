"""The draft re-quantized once to Q4_0 (``specdec.loading.requantize``): which matrices change and to what, the
copy written once and never half, the pair loading it by default, and the output still exactly the target's.

A tiny random Qwen2 file (``tiny_qwen2``: Q4_K matrices, Q6_K ffn_down, one Q6_K attn_v and a Q6_K head): the
Q6_K layer matrices become Q4_0 (gguf's quantizer over their de-quantized values), the Q4_K ones (4.5 bits, no
fewer bytes in Q4_0), the head, the embedding, norms and biases are copied byte for byte, and so is the metadata.
Exactness: greedy speculative decoding with the re-quantized draft gives plain decoding's tokens, and sampled
3-token continuations have the target's distribution (chi-square, false-alarm rate 1e-3, fixed seeds).
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
from test_exactness import chi_square_pvalue
from test_exactness_native import RUNS, SETTINGS, VOCAB, exact_distribution, speculative_counts
from tiny_qwen2 import write_tiny_qwen2

import specdec.loading.requantize as rq
from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.loading.settings import LoadSettings
from specdec.models.native import NativeModel, NativeSettings

Q4_0, Q4_K, Q6_K = gguf.GGMLQuantizationType.Q4_0, gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K


@pytest.fixture
def cache(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setattr(rq, "cache_dir", lambda: folder)
    return folder


@pytest.fixture
def source(tmp_path):
    return write_tiny_qwen2(tmp_path / "draft.gguf", seed=4)


def tensors(path):
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def test_the_wide_matrices_become_q4_0_and_everything_else_is_copied(cache, source):
    out = rq.requantized(source, progress=False)
    assert out != source and os.path.dirname(out) == str(cache / "requantized") and ".q4_0." in out
    before, after = tensors(source), tensors(out)
    assert list(before) == list(after)
    changed = [name for name, t in after.items() if t.tensor_type != before[name].tensor_type]
    assert changed and all(after[name].tensor_type == Q4_0 for name in changed)
    assert sorted(changed) == sorted(name for name, t in before.items() if t.tensor_type == Q6_K
                                     and name not in ("output.weight", "token_embd.weight"))
    for name in changed:  # gguf's Q4_0 quantizer over the values the file stores
        want = gguf.quants.quantize(gguf.quants.dequantize(before[name].data, Q6_K), Q4_0)
        assert np.array_equal(np.asarray(after[name].data), want), name
        assert after[name].shape.tolist() == before[name].shape.tolist()
    for name, t in before.items():
        if name not in changed:
            assert after[name].tensor_type == t.tensor_type and np.array_equal(after[name].data, t.data), name
    assert any(t.tensor_type == Q4_K for t in after.values())  # 4.5 bits: kept
    fields_before, fields_after = gguf.GGUFReader(source).fields, gguf.GGUFReader(out).fields
    names = [n for n in fields_before if not n.startswith("GGUF.")]
    assert names == [n for n in fields_after if not n.startswith("GGUF.")]
    for n in names:
        assert fields_after[n].contents() == fields_before[n].contents(), n


def test_written_once_then_found_and_a_copy_of_itself_is_itself(cache, source):
    out = rq.requantized(source, progress=False)
    stamp = os.stat(out).st_mtime_ns
    assert rq.requantized(source, progress=False) == out and os.stat(out).st_mtime_ns == stamp
    assert rq.requantized(out, progress=False) == out  # nothing left above 4.5 bits: the file itself
    assert rq.requantized(source, "none") == source


def test_a_changed_source_gets_a_new_copy_and_the_old_one_goes(cache, source):
    old = rq.requantized(source, progress=False)
    write_tiny_qwen2(source, seed=5)
    os.utime(source, ns=(os.stat(old).st_mtime_ns + 10**9,) * 2)
    new = rq.requantized(source, progress=False)
    assert new != old and os.path.exists(new) and not os.path.exists(old)


def test_a_failure_while_writing_leaves_nothing_behind(cache, source, monkeypatch):
    calls = []

    def failing(data, qtype):
        calls.append(qtype)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return quantize(data, qtype)

    quantize = gguf.quants.quantize
    monkeypatch.setattr(gguf.quants, "quantize", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        rq.requantized(source, progress=False)
    assert not rq.requantized_path(source).exists()
    assert [p.name for p in (cache / "requantized").iterdir() if p.suffix != ".lock"] == []


def test_a_bad_setting_names_the_value_and_the_choices():
    with pytest.raises(ValueError, match=r"draft_quant='q3' is invalid: choose one of q4_0, none"):
        LoadSettings(draft_quant="q3")
    with pytest.raises(ValueError, match="draft_quant='q3'"):
        rq.requantized("any.gguf", "q3")


def test_the_native_pair_loads_the_copy_by_default_and_the_file_with_none(cache, tmp_path):
    from specdec.loading.pair import load_pair

    target = write_tiny_qwen2(tmp_path / "target.gguf", seed=3, tokenizer=True)
    draft = write_tiny_qwen2(tmp_path / "draft-tok.gguf", seed=4, tokenizer=True)
    names = {}
    for quant in ("q4_0", "none"):
        pair = load_pair(LoadSettings(target=target, draft_model=draft, backend="native", draft_quant=quant))
        names[quant] = pair.draft.path
    assert names["none"] == draft and names["q4_0"] == str(rq.requantized_path(draft))


def test_greedy_speculative_with_the_copy_is_plain_decoding(cache, tmp_path):
    target = NativeModel(write_tiny_qwen2(tmp_path / "t.gguf", seed=3), NativeSettings(1))
    draft = NativeModel(rq.requantized(write_tiny_qwen2(tmp_path / "d.gguf", seed=4), progress=False),
                        NativeSettings(1))
    prompt, greedy = [1, 5, 9, 2, 7], SamplingParams(temperature=0.0)
    plain = autoregressive_generate(target, prompt, max_new_tokens=24, sampling=greedy)
    for gamma in (1, 3, 5):
        spec = speculative_generate(target, ModelDrafter(draft), prompt, max_new_tokens=24, gamma=gamma,
                                    sampling=greedy)
        assert spec.tokens == plain.tokens


def test_sampled_sequences_with_the_copy_have_the_target_distribution(cache, tmp_path):
    target = NativeModel(write_tiny_qwen2(tmp_path / "t4.gguf", seed=3, vocab=VOCAB, head_scale=0.2),
                         NativeSettings(1))
    source = write_tiny_qwen2(tmp_path / "d4.gguf", seed=4, vocab=VOCAB, head_scale=0.2)
    draft = NativeModel(rq.requantized(source, progress=False), NativeSettings(1))
    sampling = SETTINGS["temperature-1"]
    dist = exact_distribution(target, sampling)
    counts, accepted, drafted = speculative_counts(target, draft, sampling)
    assert 0 < accepted < drafted
    assert chi_square_pvalue(counts, dist, RUNS) > 1e-3
