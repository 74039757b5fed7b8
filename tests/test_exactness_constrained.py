"""Sequence-level exactness under a constraint: speculative sampling with the constraint's mask on p and q alike
gives exactly the constrained target distribution.

Same design as ``test_exactness.py`` (its V = 4 bigram target and draft, 2-token prompt, 5 new tokens, pooled
chi-square): the constraint is a :class:`specdec.constraint.TokenAutomaton` with branches and a forced stretch —
state 0 allows 0, 1 or 3; after 0 the token 2 is forced (state 1); state 2 (after 1) allows 0 or 3, and 3 loops
into state 2 — so some rounds are forced drafts (one-hot q, no draft call), some draw under a mask of 2 or 3
tokens, and lookup guesses the mask forbids are cut. The exact distribution: each step's list is the sampling
transform of the target's logits with the disallowed tokens at -inf, multiplied along every path of the
automaton. Per (drafter, sampling setting, γ) RUNS seeded runs; plain constrained decoding is checked against
the same oracle.

FALSE_ALARM = 10⁻³ per test, 18 tests: a false alarm with probability below 1.8% for a random seed; the seeds
are fixed, so the outcome is reproducible. ``test_the_test_detects_...`` shows the same test, at the same run
count, rejects a lookup drafter that reports a uniform q for its guesses.
"""

from __future__ import annotations

import itertools
import os

import pytest
import torch
from test_exactness import FALSE_ALARM, NEW_TOKENS, PROMPT, VOCAB, chi_square_pvalue, models
from test_exactness_drafters import MislabeledLookup, run_jobs

from specdec import ModelDrafter, SamplingParams, autoregressive_generate, speculative_generate
from specdec.constraint import DraftMasks, Lazy, TokenAutomaton, everything, mask_logits
from specdec.drafters import CompositeDrafter, Proposal
from specdec.drafters.lookup import PromptLookupDrafter
from specdec.models.bigram import BigramModel
from specdec.sampling import probs_from_logits

RUNS = int(os.environ.get("SPECDEC_EXACTNESS_RUNS", "5000"))
GAMMAS = (1, 3)
SETTINGS = {
    "temperature-1": SamplingParams(temperature=1.0),
    "temperature-0.7-top-k-2": SamplingParams(temperature=0.7, top_k=2),
}
DRAFTERS = ("model", "lookup", "lookup+model")
EDGES = {0: {0: 1, 1: 2, 3: 0}, 1: {2: 0}, 2: {0: 1, 3: 2}}


# The lazy constraint: free until the trigger 3, then INNER from the trigger on (after 3: 0 or 1; 0 forces 2; 1 loops).
INNER = {0: {3: 1}, 1: {0: 2, 1: 1}, 2: {2: 1}}
LAZY_TRIGGER = 3


def automaton() -> TokenAutomaton:
    return TokenAutomaton(EDGES, VOCAB)


# A leading call: the reply opens with 1, then 0 or 1 (recognised there: two tokens), then 0 or 2 for good; any
# other opening is text, free.
LEAD = {0: {1: 1}, 1: {0: 2, 1: 2}, 2: {0: 2, 2: 2}}


def two_tokens(tokens) -> bool:
    return len(tokens) >= 2


def lazy() -> Lazy:
    return Lazy(VOCAB, tagged=TokenAutomaton(INNER, VOCAB), triggers=[LAZY_TRIGGER])


def lazy_lead() -> Lazy:
    return Lazy(VOCAB, leading=TokenAutomaton(LEAD, VOCAB), commits=two_tokens)


def distribution_under(constraint_of, sampling: SamplingParams, length: int) -> dict:
    """The exact distribution of ``length`` tokens after PROMPT under fresh constraints from ``constraint_of``:
    each step's list is the sampling transform of the target's logits masked by the constraint there."""
    target = models()[0]
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        prob, prev, constraint = 1.0, PROMPT[-1], constraint_of()
        for token in seq:
            allowed = constraint.allowed()
            if not bool(allowed[token]):
                prob = 0.0
                break
            prob *= float(probs_from_logits(mask_logits(target.log_probs[prev], allowed), sampling)[token])
            constraint.consume([token])
            prev = token
        if prob > 0:
            dist[seq] = prob
    return dist


def constrained_distribution(sampling: SamplingParams, length: int) -> dict:
    target = models()[0]
    dist = {}
    for seq in itertools.product(range(VOCAB), repeat=length):
        prob, prev, state = 1.0, PROMPT[-1], 0
        for token in seq:
            if token not in EDGES[state]:
                prob = 0.0
                break
            allowed = torch.zeros(VOCAB, dtype=torch.bool)
            allowed[list(EDGES[state])] = True
            prob *= float(probs_from_logits(mask_logits(target.log_probs[prev], allowed), sampling)[token])
            prev, state = token, EDGES[state][token]
        if prob > 0:
            dist[seq] = prob
    return dist


class UniformLookup(MislabeledLookup):
    """MislabeledLookup under a constraint: guesses cut by the mask, q reported uniform (wrong)."""

    def propose(self, sequence, gamma, sampling, generator, allowed=None) -> Proposal:
        draft = PromptLookupDrafter.propose(self, sequence, gamma, sampling, generator, allowed=allowed)
        return Proposal(draft.tokens, torch.full_like(draft.probs, 1.0 / VOCAB), calls=0)


CUT = (0, 3)  # the tokens a cut draft head leaves out (state 2 allows only these: the draft stops drafting there)


def cut_draft() -> BigramModel:
    """The draft with its head cut: probability 0 on the tokens of CUT (the real draft's 32,768-token head gives
    0 to a tool call's closing tag), renormalised."""
    table = models()[1].probs.clone()
    table[:, list(CUT)] = 0
    return BigramModel(table / table.sum(1, keepdim=True))


def make(name: str):
    if name == "cut-model":
        return ModelDrafter(cut_draft())
    if name == "mislabeled-lookup":
        return UniformLookup(VOCAB, dtype=torch.float64, min_ngram=1)
    if name == "model":
        return ModelDrafter(models()[1])
    if name == "lookup":
        return PromptLookupDrafter(VOCAB, dtype=torch.float64, min_ngram=1)
    return CompositeDrafter(PromptLookupDrafter(VOCAB, dtype=torch.float64, min_ngram=1), ModelDrafter(models()[1]))


def _count(job: tuple) -> tuple[dict, dict]:
    name, setting, gamma, seeds = job
    torch.set_num_threads(1)
    target = models()[0]
    counts: dict = {}
    usage = {"forced": 0, "drafted": 0, "accepted": 0, "rejected": 0, "triggered": 0}
    constraint_of = automaton
    if name.startswith("lazy-lead-"):
        name, constraint_of = name.removeprefix("lazy-lead-"), lazy_lead
    elif name.startswith("lazy-"):
        name, constraint_of = name.removeprefix("lazy-"), lazy
    for seed in seeds:
        constraint = constraint_of()
        if name == "plain":
            gen = autoregressive_generate(target, PROMPT, max_new_tokens=NEW_TOKENS, sampling=SETTINGS[setting],
                                          seed=seed, constraint=constraint)
        else:
            gen = speculative_generate(target, make(name), PROMPT, max_new_tokens=NEW_TOKENS, gamma=gamma,
                                       sampling=SETTINGS[setting], seed=seed, constraint=constraint)
        usage["triggered"] += bool(getattr(constraint, "active", False))
        key = tuple(gen.tokens)
        counts[key] = counts.get(key, 0) + 1
        for record in gen.stats.records:
            usage["forced"] += record.forced
            usage["drafted"] += len(record.drafted) - record.forced
            usage["accepted"] += record.n_accepted
            usage["rejected"] += record.n_accepted < len(record.drafted)
    return counts, usage


@pytest.fixture(scope="module")
def outcomes():
    jobs = [(name, setting, gamma, range(half, RUNS, 2))
            for name in DRAFTERS for setting in SETTINGS for gamma in GAMMAS for half in (0, 1)]
    jobs += [("plain", setting, 0, range(half, RUNS, 2)) for setting in SETTINGS for half in (0, 1)]
    jobs += [("mislabeled-lookup", "temperature-1", 3, range(half, RUNS, 2)) for half in (0, 1)]
    jobs += [("cut-model", "temperature-1", 3, range(half, RUNS, 2)) for half in (0, 1)]
    jobs += [("lazy-" + name, "temperature-1", 3, range(half, RUNS, 2)) for name in DRAFTERS for half in (0, 1)]
    jobs += [("lazy-plain", "temperature-1", 0, range(half, RUNS, 2)) for half in (0, 1)]
    jobs += [("lazy-lead-" + name, "temperature-1", 3, range(half, RUNS, 2)) for name in ("model", "lookup+model")
             for half in (0, 1)]
    return run_jobs(_count, jobs)


@pytest.mark.parametrize("gamma", GAMMAS)
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", DRAFTERS)
def test_constrained_speculative_sequences_have_the_constrained_target_distribution(outcomes, name, setting, gamma):
    counts, usage = outcomes[(name, setting, gamma)]
    assert sum(counts.values()) == RUNS
    assert usage["forced"] > 0.05 * RUNS, f"no forced drafts: {usage}"
    assert usage["drafted"] > 0.1 * RUNS and usage["rejected"] > 0.02 * RUNS, f"rule not exercised: {usage}"
    assert chi_square_pvalue(counts, constrained_distribution(SETTINGS[setting], NEW_TOKENS), RUNS) > FALSE_ALARM


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_constrained_plain_decoding_has_the_constrained_target_distribution(outcomes, setting):
    counts, _ = outcomes[("plain", setting, 0)]
    assert chi_square_pvalue(counts, constrained_distribution(SETTINGS[setting], NEW_TOKENS), RUNS) > FALSE_ALARM


@pytest.mark.parametrize("name", DRAFTERS + ("plain",))
def test_lazily_constrained_sequences_have_the_lazily_constrained_target_distribution(outcomes, name):
    """Free until the trigger, the inner automaton from it on (tool calls under tool_choice auto): exact too.
    Mid-draft triggers and forced tails both occur (the trigger drafted, then what the inner one forces)."""
    counts, usage = outcomes[("lazy-" + name, "temperature-1", 0 if name == "plain" else 3)]
    assert sum(counts.values()) == RUNS
    assert 0.2 * RUNS < usage["triggered"] < 0.95 * RUNS, f"the trigger is not exercised both ways: {usage}"
    if name != "plain":
        assert usage["forced"] > 0.02 * RUNS and usage["rejected"] > 0.02 * RUNS, f"rule not exercised: {usage}"
    exact = distribution_under(lazy, SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, exact, RUNS) > FALSE_ALARM


@pytest.mark.parametrize("name", ["model", "lookup+model"])
def test_a_lazily_constrained_leading_call_has_the_lazily_constrained_target_distribution(outcomes, name):
    """A call that opens the reply (Llama 3's, Qwen2.5-Coder's bare JSON): free until recognised, then held."""
    counts, usage = outcomes[("lazy-lead-" + name, "temperature-1", 3)]
    assert sum(counts.values()) == RUNS
    assert 0.05 * RUNS < usage["triggered"] < 0.95 * RUNS, f"the call is not recognised both ways: {usage}"
    exact = distribution_under(lazy_lead, SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, exact, RUNS) > FALSE_ALARM


def test_a_draft_that_gives_every_allowed_token_probability_0_stops_drafting_there(outcomes):
    """A cut head (q = 0 on every token the mask allows: no draft can be drawn) ends the round's drafts at that
    position and the target draws it: still exactly the constrained target distribution."""
    counts, usage = outcomes[("cut-model", "temperature-1", 3)]
    assert sum(counts.values()) == RUNS
    assert usage["drafted"] > 0.1 * RUNS and usage["rejected"] > 0.02 * RUNS, f"rule not exercised: {usage}"
    assert any(2 in seq for seq in counts), "state 2 (only cut tokens allowed) never reached"
    exact = constrained_distribution(SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, exact, RUNS) > FALSE_ALARM


def test_a_cut_draft_proposes_nothing_where_it_gives_every_allowed_token_probability_0():
    masks = DraftMasks(TokenAutomaton(EDGES, VOCAB, start=2))  # state 2 allows 0 and 3: both cut
    draft = ModelDrafter(cut_draft())
    draft.begin(PROMPT)
    proposal = draft.propose(PROMPT, 3, SETTINGS["temperature-1"], torch.Generator().manual_seed(0),
                             allowed=masks.after)
    assert proposal.tokens == [] and tuple(proposal.probs.shape) == (0, VOCAB) and proposal.calls == 1
    greedy = SamplingParams(temperature=0)
    for prompt in ([2, 0], [1, 3], [3, 3, 1]):
        plain = autoregressive_generate(models()[0], prompt, max_new_tokens=12, sampling=greedy,
                                        constraint=automaton())
        spec = speculative_generate(models()[0], ModelDrafter(cut_draft()), prompt, max_new_tokens=12, gamma=3,
                                    sampling=greedy, constraint=automaton())
        assert spec.tokens == plain.tokens


def test_the_test_detects_a_lookup_drafter_with_a_wrong_q(outcomes):
    counts, usage = outcomes[("mislabeled-lookup", "temperature-1", 3)]
    assert usage["drafted"] > 0.1 * RUNS
    dist = constrained_distribution(SETTINGS["temperature-1"], NEW_TOKENS)
    assert chi_square_pvalue(counts, dist, RUNS) < FALSE_ALARM


def test_greedy_constrained_speculative_equals_greedy_constrained_plain():
    target, draft = models()
    greedy = SamplingParams(temperature=0)
    for prompt in ([2, 0], [1, 3], [3, 3, 1]):
        plain = autoregressive_generate(target, prompt, max_new_tokens=12, sampling=greedy, constraint=automaton())
        for gamma in (1, 2, 4):
            spec = speculative_generate(target, ModelDrafter(draft), prompt, max_new_tokens=12, gamma=gamma,
                                        sampling=greedy, constraint=automaton())
            assert spec.tokens == plain.tokens
            assert spec.stats.forced > 0
        state = automaton()
        state.consume(plain.tokens)  # every token the constraint allowed, in order


def test_draft_masks_follow_the_drafts_and_settle_on_the_kept_tokens():
    constraint = automaton()
    masks = DraftMasks(constraint)
    assert masks.after([]).tolist() == [True, True, False, True]
    assert masks.after([0]).tolist() == [False, False, True, False]  # 0 forces 2
    assert masks.after([0, 2]).tolist() == [True, True, False, True]
    assert masks.after([1]).tolist() == [True, False, False, True]  # another branch: rolled back first
    masks.settle([1, 3])  # the draft 1 accepted, then the target's 3
    assert constraint.state == 2 and constraint.path == [0, 2, 2]
    assert automaton().forced() == [] and TokenAutomaton(EDGES, VOCAB, start=1).forced() == [2]


def test_a_constraint_that_allows_nothing_is_refused():
    with pytest.raises(ValueError, match="allows no token"):
        mask_logits(torch.zeros(4), torch.zeros(4, dtype=torch.bool))
    with pytest.raises(ValueError, match="not allowed in state 1"):
        TokenAutomaton(EDGES, VOCAB, start=1).consume([3])


def test_a_lazy_constraint_is_free_until_its_trigger_and_the_inner_one_from_it_on():
    constraint = lazy()
    assert constraint.allowed() is everything(VOCAB) and constraint.forced() == []
    constraint.consume([0, 2, 1])  # free text: anything, the trigger's inner automaton never asked
    assert not constraint.active and constraint.allowed() is everything(VOCAB)
    constraint.consume([3])  # the trigger: the inner automaton takes it as its first token
    assert constraint.active and constraint.allowed().tolist() == [True, True, False, False]
    constraint.consume([0])
    assert constraint.forced() == [2] and constraint.allowed().tolist() == [False, False, True, False]
    with pytest.raises(ValueError, match="not allowed"):
        constraint.consume([3])
    constraint.rollback(1)  # back before the 0: still inside
    assert constraint.active and constraint.tagged.path == [0, 1]
    constraint.rollback(2)  # past the trigger: free again, the inner automaton at its start
    assert not constraint.active and constraint.tagged.path == [0] and len(constraint.log) == 2
    assert mask_logits(torch.zeros(VOCAB), constraint.allowed()).tolist() == [0.0] * VOCAB
    with pytest.raises(ValueError, match="cannot roll back 3"):
        constraint.rollback(3)


def test_a_leading_call_is_free_until_recognised_then_held_and_text_stays_free():
    """Llama 3's calls and Qwen2.5-Coder's bare ones: while the reply can still be a call it is free and the call's
    constraint follows along; once recognised (here: two tokens) its mask is on; an opening it refuses is text."""
    call = Lazy(VOCAB, leading=TokenAutomaton(LEAD, VOCAB), commits=two_tokens, openers=[3])
    assert call.phase == "lead" and call.allowed() is everything(VOCAB)
    call.consume([3])  # an opener (<|python_tag|>): the call may still come
    call.consume([1])
    assert call.phase == "lead" and call.allowed() is everything(VOCAB)
    call.consume([0])  # recognised
    assert call.active and call.allowed().tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match="not allowed"):
        call.consume([1])
    call.rollback(1)  # back before the recognition: free again, the call's automaton one step back
    assert call.phase == "lead" and call.leading.path == [0, 1]
    call.consume([3])  # refused by the call: the reply is text, free for good
    assert call.phase == "free" and not call.active
    call.consume([1, 0, 1])
    assert call.allowed() is everything(VOCAB) and call.leading.path == [0, 1]
    call.rollback(5)
    assert call.phase == "lead" and call.leading.path == [0]
    text = Lazy(VOCAB, leading=TokenAutomaton(LEAD, VOCAB), commits=two_tokens, openers=[3])
    text.consume([2, 3])  # text first: a later opener is no opener
    assert text.phase == "free"
    both = Lazy(VOCAB, tagged=TokenAutomaton(INNER, VOCAB), triggers=[3], leading=TokenAutomaton(LEAD, VOCAB),
                commits=two_tokens)
    both.consume([0, 3])  # text, then the tagged trigger
    assert both.phase == "tagged" and both.allowed().tolist() == [True, True, False, False]


def test_draft_masks_give_the_tokens_forced_after_the_drafts():
    masks = DraftMasks(automaton())
    assert masks.forced_after([0], 4) == [2] and masks.forced_after([1], 4) == []
    assert masks.forced_after([0], 0) == []
    masks.settle([0, 2])
    assert masks.constraint.path == [0, 1, 0]
