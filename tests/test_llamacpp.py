"""The llama.cpp backend (LlamaCppModel) on tiny random-weight GGUF files written here (no downloads).

What must hold for the rule to stay exact on this engine: a token's logits are the same whether it
is scored alone or in a block (plain decoding scores one token a call, verification γ + 1), the
cache rolls back exactly, and greedy speculative output equals plain output token for token. The
sequence-level test runs whole speculative generations through llama.cpp and compares the
frequencies of every output sequence with their exact probabilities (false-alarm rate below).

Skipped when llama-cpp-python is not installed, unless SPECDEC_REQUIRE_LLAMACPP or
SPECDEC_REQUIRE_REAL is set (scripts/test.sh sets the latter, so CI cannot skip them silently).
"""

import json
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
from tiny_gguf import write_tiny_llama

from specdec import SamplingParams, autoregressive_generate, probs_from_logits, speculative_generate
from specdec.models import llamacpp

if not llamacpp.available():
    if os.environ.get("SPECDEC_REQUIRE_LLAMACPP") or os.environ.get("SPECDEC_REQUIRE_REAL"):
        raise RuntimeError("llama-cpp-python is required here but not installed: " + llamacpp.INSTALL_HINT)
    pytest.skip("llama-cpp-python not installed", allow_module_level=True)

from specdec.models.llamacpp import LlamaCppModel, LlamaCppSettings  # noqa: E402

ONE_THREAD = LlamaCppSettings(n_threads=1)  # tiny models: threads only add start-up cost
TARGET = LlamaCppSettings(n_threads=1, batch_invariant=True)  # a target's setting: rows independent of the block size
GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """{name: path} of the tiny models: f32, q8_0 and q4_0 targets and a noisy-head f32 draft."""
    root = tmp_path_factory.mktemp("gguf")
    paths = {q: write_tiny_llama(root / f"target-{q}.gguf", qtype=q) for q in ("f32", "q8_0", "q4_0")}
    paths["draft"] = write_tiny_llama(root / "draft.gguf", head_noise=0.8)
    return paths


@pytest.fixture(scope="module")
def target(files):
    return LlamaCppModel(files["f32"], TARGET)


def random_ids(n: int, vocab: int, seed: int) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


# --- loading and bad input ---------------------------------------------------------------------

def test_loads_a_gguf_file_with_its_vocabulary_and_context(target):
    assert target.vocab_size == 8
    assert target.max_length >= 1023 and target.length == 0
    assert target.device == torch.device("cpu")
    assert target.threads == (1, 1)
    assert target.token_text(2) == b"c"
    assert target.tokenize("cab") == [2, 0, 1]


@pytest.mark.parametrize("settings, fragment", [
    (LlamaCppSettings(n_ctx=8), r"n_ctx=8 is invalid: must be an integer >= 16"),
    (LlamaCppSettings(n_ctx=100_000), r"n_ctx must be in \[16, 1024\]"),
    (LlamaCppSettings(n_batch=4, batch_invariant=True), r"n_batch=4 is invalid with batch_invariant: must be >= 9"),
    (LlamaCppSettings(repack=True, batch_invariant=True), r"repack=True is invalid with batch_invariant"),
    (LlamaCppSettings(n_batch=0), r"n_batch=0 is invalid"),
    (LlamaCppSettings(n_threads=0), r"n_threads=0 is invalid"),
    (LlamaCppSettings(n_threads_batch=-2), r"n_threads_batch=-2 is invalid"),
])
def test_refuses_bad_settings(files, settings, fragment):
    with pytest.raises(ValueError, match=fragment):
        LlamaCppModel(files["f32"], settings)


def test_refuses_missing_and_broken_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        LlamaCppModel(tmp_path / "missing.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"not a gguf file at all")
    with pytest.raises(ValueError, match="llama.cpp could not load"):
        LlamaCppModel(broken)


def test_refuses_ids_outside_the_vocabulary_and_overflowing_the_context(files):
    model = LlamaCppModel(files["f32"], LlamaCppSettings(n_ctx=16, n_threads=1, batch_invariant=True))
    assert model.max_length >= 15  # llama.cpp may round the context up (to 256 here), less 1 for padding
    with pytest.raises(ValueError, match=r"ids must be in \[0, 7\]"):
        model.score([8])
    full = model.max_length
    model.prefill(random_ids(full - 1, 8, 0))
    with pytest.raises(ValueError, match="exceed its context"):
        model.score([1, 2])
    assert model.length == full - 1  # nothing was decoded
    with pytest.raises(ValueError, match=rf"length must be in \[0, {full - 1}\]"):
        model.trim(full)


# --- the protocol ------------------------------------------------------------------------------

def test_prefill_score_trim_keep_the_length(target):
    target.prefill([1, 2, 3])
    assert target.length == 3
    logits = target.score([4, 5])
    assert logits.shape == (2, 8) and logits.dtype == torch.float32
    assert target.length == 5
    target.trim(3)
    assert target.length == 3
    assert target.score([]).shape == (0, 8)


def test_trim_and_rescore_reproduce_the_logits_exactly(target):
    prompt, block = random_ids(20, 8, 1), random_ids(6, 8, 2)
    target.prefill(prompt)
    first = target.score(block)
    target.trim(len(prompt) + 2)  # keep 2 of the 6, like a round that accepted 2 drafts
    again = target.score(block[2:])
    assert torch.equal(again, first[2:])
    target.trim(len(prompt))
    assert torch.equal(target.score(block), first)


def test_prefill_computes_the_same_cache_as_scoring(target):
    """A prompt read without logits leaves the same cache as one scored token by token."""
    prompt = random_ids(30, 8, 3)
    target.prefill(prompt[:-1])
    after_prefill = target.score(prompt[-1:])[0]
    target.prefill([])
    scored = torch.cat([target.score([t]) for t in prompt])
    assert torch.equal(after_prefill, scored[-1])


def test_prompts_longer_than_one_batch_are_read_in_chunks(files):
    small = LlamaCppModel(files["f32"], LlamaCppSettings(n_batch=9, n_threads=1, batch_invariant=True))
    large = LlamaCppModel(files["f32"], LlamaCppSettings(n_batch=64, n_threads=1, batch_invariant=True))
    prompt = random_ids(40, 8, 4)
    small.prefill(prompt[:-1])
    large.prefill(prompt[:-1])
    assert small.length == 39
    torch.testing.assert_close(small.score(prompt[-1:]), large.score(prompt[-1:]), rtol=0, atol=1e-4)
    small.prefill([])
    assert small.score(prompt).shape == (40, 8)  # a score call of 40 tokens in chunks of 9 (the last one padded)


@pytest.mark.parametrize("qtype", ["f32", "q8_0", "q4_0"])
@pytest.mark.parametrize("flash_attn", [True, False], ids=["flash-attn", "no-flash-attn"])
@pytest.mark.parametrize("context", [25, 600])  # 600: llama.cpp's KV view reaches 768 cells (split-KV kernels)
def test_target_rows_do_not_depend_on_the_block_size(files, qtype, flash_attn, context):
    """A token's logits are the same bit for bit scored alone or in a block of 2, 5 or 9 (2 threads:
    llama.cpp's one-token attention splits the cache over threads when it can)."""
    model = LlamaCppModel(files[qtype], LlamaCppSettings(n_threads=2, batch_invariant=True, flash_attn=flash_attn))
    prompt, block = random_ids(context, 8, 5), random_ids(9, 8, 6)
    model.prefill(prompt)
    alone = torch.cat([model.score([t]) for t in block])  # [9, vocab]
    for size in (2, 5, 9):
        model.trim(context)
        together = model.score(block[:size])  # [size, vocab]
        diff = float((together - alone[:size]).abs().max())
        assert diff == 0.0, f"{qtype}: a block of {size} and one-token calls differ by up to {diff:.3e}"


def test_padding_leaves_no_trace_in_the_cache(files):
    model = LlamaCppModel(files["q8_0"], TARGET)
    # q8_0 (like f32) weights are multiplied by tinyBLAS for >= 2 rows and by vec_dot for one, so
    # the load-time probe must have found that one-token calls need padding.
    assert model.min_rows == 2
    model.prefill([1, 2, 3])
    model.score([4])
    assert model.length == 4
    model.score([5, 6])
    model.trim(4)
    again = model.score([5, 6])
    model.prefill([1, 2, 3, 4])
    assert torch.equal(model.score([5, 6]), again)


def test_threads_do_not_change_the_logits(files):
    model = LlamaCppModel(files["q8_0"], TARGET)
    prompt = random_ids(25, 8, 7)
    model.prefill(prompt)
    one = model.score([3, 4, 5])
    model.set_threads(2)
    assert model.threads == (2, 2)
    model.trim(len(prompt))
    assert torch.equal(model.score([3, 4, 5]), one)


# --- decoding through llama.cpp ----------------------------------------------------------------

@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_speculative_equals_plain_decoding(files, target, gamma):
    draft = LlamaCppModel(files["draft"], ONE_THREAD)
    for seed in range(3):
        prompt = random_ids(5, 8, 100 + seed)
        plain = autoregressive_generate(target, prompt, max_new_tokens=40, sampling=GREEDY)
        spec = speculative_generate(target, draft, prompt, max_new_tokens=40, gamma=gamma, sampling=GREEDY)
        assert spec.tokens == plain.tokens
        assert 0 < spec.stats.accepted < spec.stats.drafted  # both accepted and rejected drafts happened


# --- sequence-level exactness ------------------------------------------------------------------
# Target: a tiny llama.cpp model over V = 4 tokens; draft: the same with a noisy output layer, so
# rounds end in every way. Each γ in SEQ_GAMMAS runs SEQ_RUNS generations (one seed each) of
# SEQ_NEW tokens after SEQ_PROMPT; the exact probability of every output sequence is computed by
# walking the tree of all continuations with the target itself, one token per call (plain
# decoding's own p). Chi-square goodness of fit (cells of expected count < 5 pooled) must not
# reject at FALSE_ALARM = 1e-3 per test; the three tests together false-alarm with probability
# below 0.3% for a random seed (the seeds are fixed, so the outcome is reproducible).

SEQ_VOCAB = 4
SEQ_PROMPT = [2, 0]
SEQ_NEW = 4
SEQ_GAMMAS = (2, 4)
SEQ_RUNS = int(os.environ.get("SPECDEC_LLAMACPP_EXACTNESS_RUNS", 10_000))
SEQ_SAMPLING = SamplingParams(temperature=1.0)


def write_seq_models(root: str) -> None:
    write_tiny_llama(os.path.join(root, "seq-target.gguf"), vocab=SEQ_VOCAB, head_scale=2.0)
    write_tiny_llama(os.path.join(root, "seq-draft.gguf"), vocab=SEQ_VOCAB, head_scale=2.0, head_noise=2.0)


def load_seq_models(root: str) -> tuple[LlamaCppModel, LlamaCppModel]:
    return (LlamaCppModel(os.path.join(root, "seq-target.gguf"), TARGET),
            LlamaCppModel(os.path.join(root, "seq-draft.gguf"), ONE_THREAD))


def exact_sequence_distribution(target: LlamaCppModel, sampling: SamplingParams) -> dict:
    """{sequence: probability} of every SEQ_NEW-token continuation of SEQ_PROMPT under plain decoding."""
    dist: dict = {}
    target.prefill(SEQ_PROMPT[:-1])

    def walk(sequence: tuple, prob: float, last: int) -> None:
        p = probs_from_logits(target.score([last])[0].double(), sampling)  # [vocab]
        for token in range(SEQ_VOCAB):
            q = prob * float(p[token])
            if q <= 0:
                continue
            if len(sequence) + 1 == SEQ_NEW:
                dist[sequence + (token,)] = q
            else:
                walk(sequence + (token,), q, token)
        target.trim(target.length - 1)

    walk((), 1.0, SEQ_PROMPT[-1])
    return dist


def _count_sequences(job: tuple) -> tuple[dict, int, int]:
    root, gamma, seeds = job
    torch.set_num_threads(1)
    target, draft = load_seq_models(root)
    counts: dict = {}
    accepted = drafted = 0
    for seed in seeds:
        gen = speculative_generate(target, draft, SEQ_PROMPT, max_new_tokens=SEQ_NEW, gamma=gamma,
                                   sampling=SEQ_SAMPLING, seed=seed)
        counts[tuple(gen.tokens)] = counts.get(tuple(gen.tokens), 0) + 1
        accepted += gen.stats.accepted
        drafted += gen.stats.drafted
    return counts, accepted, drafted


@pytest.fixture(scope="module")
def seq_outcomes(tmp_path_factory):
    """(exact distribution, {γ: (counts, accepted, drafted)}), the runs split over two processes."""
    root = str(tmp_path_factory.mktemp("seq"))
    write_seq_models(root)
    target, _ = load_seq_models(root)
    dist = exact_sequence_distribution(target, SEQ_SAMPLING)
    jobs = [(root, gamma, range(half, SEQ_RUNS, 2)) for gamma in SEQ_GAMMAS for half in (0, 1)]
    # spawn, not fork: llama.cpp's threads and locks must not be copied into a child mid-state.
    with multiprocessing.get_context("spawn").Pool(min(2, llamacpp.cpu_cores())) as pool:
        results = pool.map(_count_sequences, jobs)
    merged: dict = {}
    for (_, gamma, _), (counts, acc, dr) in zip(jobs, results, strict=True):
        total, a, d = merged.get(gamma, ({}, 0, 0))
        for seq, n in counts.items():
            total[seq] = total.get(seq, 0) + n
        merged[gamma] = (total, a + acc, d + dr)
    return dist, merged


def test_exact_distribution_sums_to_one(seq_outcomes):
    dist, _ = seq_outcomes
    assert len(dist) == SEQ_VOCAB**SEQ_NEW
    assert sum(dist.values()) == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("gamma", SEQ_GAMMAS)
def test_speculative_sequences_through_llamacpp_have_the_target_distribution(seq_outcomes, gamma):
    from test_exactness import FALSE_ALARM, chi_square_pvalue

    dist, outcomes = seq_outcomes
    counts, accepted, drafted = outcomes[gamma]
    assert sum(counts.values()) == SEQ_RUNS
    assert 0.3 < accepted / drafted < 0.95, "the rule must be exercised both ways"
    assert chi_square_pvalue(counts, dist, SEQ_RUNS) > FALSE_ALARM


def test_sequences_pooled_over_gamma_through_llamacpp(seq_outcomes):
    from test_exactness import FALSE_ALARM, chi_square_pvalue

    dist, outcomes = seq_outcomes
    pooled: dict = {}
    for counts, _, _ in outcomes.values():
        for seq, n in counts.items():
            pooled[seq] = pooled.get(seq, 0) + n
    assert chi_square_pvalue(pooled, dist, SEQ_RUNS * len(SEQ_GAMMAS)) > FALSE_ALARM


# --- the real default pair through llama.cpp ---------------------------------------------------

REAL_PROMPTS = [
    "Write a Python function that reverses a string.",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n",
    "Ünïcödé, emoji 🚀 and tabs\tin one line — ok?",
]


@pytest.fixture(scope="module")
def real_pair():
    from specdec.loading import defaults as zoo
    from specdec.loading.pair import load_pair
    from specdec.loading.settings import LoadSettings

    if zoo.missing_packages(zoo.DEFAULT_TARGET) or zoo.missing_packages(zoo.DEFAULT_DRAFT):
        if os.environ.get("SPECDEC_REQUIRE_REAL"):
            raise RuntimeError("SPECDEC_REQUIRE_REAL is set but specdec[default-models] is not installed")
        pytest.skip("specdec[default-models] not installed")
    threads = torch.get_num_threads()
    torch.set_num_threads(llamacpp.cpu_cores())
    yield load_pair(LoadSettings(backend="llamacpp"))
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_real_pair_loads_through_llamacpp(real_pair):
    assert real_pair.backend == "llamacpp"
    assert isinstance(real_pair.target, LlamaCppModel) and isinstance(real_pair.draft, LlamaCppModel)
    assert real_pair.target.vocab_size == real_pair.draft.vocab_size == 151936
    assert 151645 in real_pair.eos_token_ids  # <|im_end|>


@pytest.mark.slow
def test_real_target_rows_do_not_depend_on_the_block_size(real_pair):
    """Bit for bit at a context past 512 cells, with 2 threads, and without padding: the default
    target's weights are K-quants, so one-token calls keep llama.cpp's one-token speed."""
    target = real_pair.target
    assert target.min_rows == 1
    target.set_threads(2)
    prompt, block = random_ids(600, target.vocab_size, 8), random_ids(6, target.vocab_size, 9)
    target.prefill(prompt)
    together = target.score(block)  # [6, vocab]
    target.trim(len(prompt))
    alone = torch.cat([target.score([t]) for t in block])
    target.set_threads(llamacpp.cpu_cores())
    assert torch.equal(together, alone)


@pytest.mark.slow
@pytest.mark.parametrize("text", REAL_PROMPTS)
def test_transformers_tokenizer_agrees_with_llamacpp(real_pair, text):
    """Prompts are encoded by the transformers tokenizer; llama.cpp must read the same ids."""
    assert real_pair.encode(text, chat=False) == real_pair.target.tokenize(text)
    chat_ids = real_pair.encode(text, chat=True)
    rendered = real_pair.tokenizer.decode(chat_ids)
    assert chat_ids == real_pair.target.tokenize(rendered)  # <|im_start|> etc. parsed as special tokens


@pytest.mark.slow
def test_greedy_speculative_equals_plain_decoding_on_the_real_pair(real_pair):
    ids = real_pair.encode(REAL_PROMPTS[0], chat=True)
    common = dict(max_new_tokens=32, sampling=GREEDY, eos_token_id=real_pair.eos_token_ids)
    plain = autoregressive_generate(real_pair.target, ids, **common)
    spec = speculative_generate(real_pair.target, real_pair.draft, ids, gamma=4, **common)
    assert spec.tokens == plain.tokens
    assert "def" in real_pair.decode(spec.tokens)
    assert spec.stats.tokens_per_target_call > 1.5


@pytest.mark.slow
def test_cli_runs_the_llamacpp_backend_and_says_so(real_pair):
    cmd = [sys.executable, "-m", "specdec", "generate", REAL_PROMPTS[0], "--backend", "llamacpp",
           "--max-new-tokens", "16", "--gamma", "3", "--compare", "--json"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert data["backend"] == "llamacpp"
    assert data["identical_to_baseline"] is True
