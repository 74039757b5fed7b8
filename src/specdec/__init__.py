"""specdec: exact speculative decoding (Leviathan, Kalman, Matias, ICML 2023).

A draft proposes γ tokens, the target scores them all in one call, and the acceptance rule keeps
a prefix and adds one token of the target's own, so the output has exactly the target's
distribution. The names exported here are the library's contract.
"""

from .choices import make_drafter, make_policy, parse_draft
from .decode import Generation, autoregressive_generate, speculative_generate
from .drafters import CompositeDrafter, Drafter, HistoryDrafter, HistoryTable, ModelDrafter, Proposal
from .drafters.lookup import PromptLookupDrafter
from .gamma import AdaptiveGamma, FixedGamma, GammaPolicy, HeuristicGamma
from .loading.load import load_model  # a model by GGUF file, name or directory, on the backend asked for
from .models.base import LanguageModel
from .models.bigram import BigramModel
from .models.hf import HFModel
from .models.kernel_types import NoKernelError  # a GGUF type the native kernels do not read (dequantize=True allows)
from .models.llamacpp import LlamaCppModel, LlamaCppSettings  # needs specdec[llamacpp] only when used
from .models.native import NativeModel, NativeSettings  # specdec's own CPU kernels on a GGUF file's blocks
from .models.ngram import NgramModel
from .rule import Verdict, verify
from .sampling import SamplingParams, probs_from_logits
from .stats import GenerationStats, RoundRecord

__version__ = "0.1.0"

__all__ = [
    "AdaptiveGamma",
    "BigramModel",
    "CompositeDrafter",
    "Proposal",
    "Drafter",
    "FixedGamma",
    "GammaPolicy",
    "Generation",
    "GenerationStats",
    "HFModel",
    "HistoryDrafter",
    "HistoryTable",
    "LlamaCppModel",
    "LlamaCppSettings",
    "HeuristicGamma",
    "LanguageModel",
    "ModelDrafter",
    "NativeModel",
    "NativeSettings",
    "NgramModel",
    "NoKernelError",
    "PromptLookupDrafter",
    "RoundRecord",
    "SamplingParams",
    "Verdict",
    "autoregressive_generate",
    "load_model",
    "make_drafter",
    "make_policy",
    "parse_draft",
    "probs_from_logits",
    "speculative_generate",
    "verify",
]
