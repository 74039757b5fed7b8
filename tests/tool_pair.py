"""A pair whose models answer a fixed script, over a small tokenizer with Qwen2.5's chat template and tokens.

``scripted_pair(reply_for)``: both models put all their mass on the next token of ``reply_for(prompt_text)``
(the prompt as the chat template rendered it, special tokens included) and then on ``<|im_end|>``; the draft
agrees with the target, so every draft is accepted. The tokenizer is a byte-level BPE (any text encodes) with
ChatML's special tokens and Qwen's non-special ``<tool_call>`` / ``</tool_call>``; its template is the default
pair's (tests/data/qwen2.5-chat-template.jinja, as read from its GGUF file).

Another tokenizer and template (``tests/test_tool_templates.py``: Llama 3.x's and Qwen3's, on llama.cpp's
vocabulary files): ``scripted_pair(reply_for, tokenizer, opening=..., end=..., eos=...)``, where ``opening`` is
the text the template's generation prompt ends with (the reply starts after its last occurrence), ``end`` the
token the models end their reply with and ``eos`` the pair's end-of-generation tokens (default: ``end``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from specdec.loading.pair import ModelPair
from specdec.models.base import Abilities, check_trim

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TOOL_TOKENS = ["<tool_call>", "</tool_call>"]
QWEN_TEMPLATE = (Path(__file__).parent / "data" / "qwen2.5-chat-template.jinja").read_text(encoding="utf-8")
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
              r"|\s+(?!\S)|\s+")
CORPUS = ('You are a helpful assistant. system user assistant the weather in Lisbon is 18 celsius\n\n'
          '{"name": "get_weather", "arguments": {"city": "Lisbon", "unit": "celsius"}} tool_response')


def small_tokenizer(template: str = QWEN_TEMPLATE):
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS + QWEN_TOOL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([CORPUS] * 5, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN_TOOL_TOKENS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", additional_special_tokens=SPECIALS)
    fast.chat_template = template
    return fast


CHATML_OPENING = "<|im_start|>assistant\n"


class ScriptedModel:
    """The next token is the script's: ``reply_for(the prompt's text)``, tokenized (special-token text as those
    tokens), then the end token. The reply starts after the prompt's last ``opening``."""

    abilities = Abilities(switch_state=True)

    def __init__(self, tokenizer, reply_for, end: int, opening: str = CHATML_OPENING) -> None:
        self.tokenizer, self.reply_for, self.end = tokenizer, reply_for, end
        self.vocab_size, self.max_length, self.device = len(tokenizer), None, torch.device("cpu")
        self.opening = tokenizer(opening, add_special_tokens=False)["input_ids"]
        self.texts: dict[tuple, str] = {}  # prompt ids → text
        self.replies: dict[str, list[int]] = {}  # reply text → ids
        self.prompts: list[str] = []  # every prompt text a reply was made for
        self._tokens: list[int] = []

    @property
    def length(self) -> int:
        return len(self._tokens)

    def prefill(self, tokens) -> int:
        self._tokens = [int(t) for t in tokens]
        return 0

    def score(self, tokens) -> torch.Tensor:
        start = len(self._tokens)
        self._tokens.extend(int(t) for t in tokens)
        # Off the script: far below it but finite, so a grammar's mask can still choose among the tokens it allows.
        rows = torch.full((len(tokens), self.vocab_size), -50.0, dtype=torch.float64)
        for j in range(len(tokens)):
            rows[j, self.next_token(start + j + 1)] = 0.0
        return rows

    def next_token(self, upto: int) -> int:
        seq, n = self._tokens[:upto], len(self.opening)
        at = next((i + n for i in range(len(seq) - n, -1, -1) if seq[i:i + n] == self.opening), None)
        if at is None:
            return self.end
        key = tuple(seq[:at])
        if key not in self.texts:
            self.texts[key] = self.tokenizer.decode(list(key))
        prompt = self.texts[key]
        if not self.prompts or self.prompts[-1] != prompt:
            self.prompts.append(prompt)
        text = self.reply_for(prompt)  # asked every time: a test may change its script between requests
        if text not in self.replies:
            self.replies[text] = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        reply = self.replies[text]
        return reply[upto - at] if upto - at < len(reply) else self.end

    def trim(self, length: int) -> None:
        check_trim(self, length)
        del self._tokens[length:]

    def state(self):
        return self._tokens

    def restore(self, state) -> None:
        self._tokens = state


def scripted_pair(reply_for, tokenizer=None, *, opening: str = CHATML_OPENING, end: str = "<|im_end|>",
                  eos: tuple[str, ...] | None = None) -> ModelPair:
    tokenizer = tokenizer or small_tokenizer()
    end_id = tokenizer.convert_tokens_to_ids(end)
    eos_ids = sorted({end_id, *(tokenizer.convert_tokens_to_ids(t) for t in eos or ())})
    models = [ScriptedModel(tokenizer, reply_for, end_id, opening) for _ in range(2)]
    return ModelPair(models[0], models[1], tokenizer, eos_token_ids=eos_ids)
