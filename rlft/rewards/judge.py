"""``judge``: a causal LM asked about a completion; its verdict read from the log-probs of a fixed set of labels.

The judge reads a question built from ``template`` (``{prompt}`` and ``{completion}`` replaced by the sample's
prompt and the completion; a chat prompt's message contents joined by newlines) and answers with one of
``labels``. Its verdict is never free text: for each label the log-probability of its tokens after the question is
summed (a multi-token label is scored token by token, teacher-forced), the labels' probabilities are normalised
over the allowed set (a softmax of those sums), and the value is the expected score::

    value = sum_j p(label_j | question) * scores[j]          p normalised over the labels

so ``labels: [yes, no], scores: [1, 0]`` gives the probability of "yes", and ``labels: ["1", "2", "3", "4", "5"],
scores: [1, 2, 3, 4, 5]`` the expected grade on a 1..5 scale. With ``chat`` (and a tokenizer that has a chat
template) the question is the user message and the label is the start of the assistant's reply (after the
template's generation prompt); otherwise the question is plain text followed directly by the label. Labels are
tokenized on their own, so a separating space belongs in the template or the label, consistently with how the
judge was trained.

Its own answer first (a reference-guided judge): with ``reference_tokens`` > 0 the judge first answers the prompt
itself, asked ``reference_template`` (``{prompt}``: the prompt as the policy sees it), greedily, up to that many
tokens or its end of turn, **without seeing the completion**; that answer fills ``{reference}`` in the question,
which then shows the judge's answer beside the proposed one::

    reference = greedy answer of the judge to reference_template(prompt)
    value = sum_j p(label_j | template(prompt, reference, completion)) * scores[j]

Zheng et al. 2023 ("Judging LLM-as-a-Judge with MT-Bench and Chatbot Arena", section 3.4) found judges misled by
the answer they grade when they solve a problem in the same prompt, and generate the judge's own answer separately
first, then show it as the reference: the same here. The reference is computed once per distinct prompt (a group's
completions share it) and kept with the verdicts. A judge is trained for it on questions whose reference is the
task's own reference response, together with those demonstrations (``sft.judge_reference``,
``rlft.data.judge_data``).

Pairs: :meth:`Judge.compare` asks ``pair_template`` (``{prompt}``, ``{first}``, ``{second}``) with the two
``pair_labels`` (first better, second better) and returns P(a better than b) **averaged over both orders**,
``(p_first(a, b) + p_second(b, a)) / 2``: an LLM judge tends to favour one position, and asking both ways cancels
that bias to first order (Lee et al. 2023, RLAIF, section 2.1, do the same). The ``label`` stage uses it.

Cost and caching: questions are scored ``batch_size`` at a time (each question's labels share its forward through
the KV cache where the model allows it), and each distinct question's label distribution is kept in a per-process
cache of ``cache`` entries (least recently used dropped first), so a (prompt, completion) seen again, in the same
batch or a later one, is not scored again. As for ``reward_model``, construction reads the model's config only;
the weights load on the first call, once per process and (path, device, dtype, trust_remote_code).

Failures follow every reward's accounting (``rlft.rewards.scoring``): a call that raises or runs past
``timeout_s`` costs the samples of that call; a non-finite value (a model that gives NaN) costs its own sample;
both are counted and logged.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from rlft.models.forward import response_logprobs
from rlft.models.loading import load_model, load_tokenizer, resolve_device
from rlft.models.reward_head import pad_batch
from rlft.models.tokens import eos_ids
from rlft.rewards.base import REWARDS, batched, check_choices
from rlft.rewards.model import read_checkpoint_config

TEMPLATE = "{prompt}\nProposed answer: {completion}\nIs the proposed answer right? Say yes or no."
REFERENCE_TEMPLATE = ("{prompt}\nReference answer: {reference}\nProposed answer: {completion}\n"
                      "Is the proposed answer right? Say yes or no.")
PAIR_TEMPLATE = ("{prompt}\nAnswer 1: {first}\nAnswer 2: {second}\n"
                 "Which answer is better? Say 1 or 2.")
_FIELDS = re.compile(r"\{(prompt|completion|first|second|reference)\}")
_LOADED: dict[tuple, tuple] = {}  # (path, device, dtype, trust_remote_code) -> (model, tokenizer)
_CACHES: dict[tuple, OrderedDict] = {}  # (judge, label set) -> question -> normalised label log-probs
_REFERENCES: dict = {}  # judge -> prompt text -> its own answer (reference_tokens > 0)
_LOCK = threading.Lock()


@REWARDS.register("judge")
@batched
@dataclass(frozen=True)
class Judge:
    """A causal LM's verdict on prompt + completion: the expected score over its allowed labels (batched)."""

    path: str
    """Directory of a causal LM checkpoint (save_pretrained layout) that answers the template's question."""
    template: str = ""
    """The question about one completion: {prompt} and {completion} are replaced (both must appear), and {reference} by the judge's own answer (reference_tokens > 0, where it must appear); empty: TEMPLATE, or REFERENCE_TEMPLATE with reference_tokens."""
    labels: tuple[str, ...] = ("yes", "no")
    """The allowed answers; their probabilities are normalised over this set (at least 2, distinct)."""
    scores: tuple[float, ...] = (1.0, 0.0)
    """The score of each label, in order; the value is their expectation under the normalised probabilities."""
    pair_template: str = PAIR_TEMPLATE
    """The question about two completions (pairs, the label stage): {prompt}, {first} and {second} replaced."""
    pair_labels: tuple[str, ...] = ("1", "2")
    """The two answers of pair_template: the first completion is better, the second is."""
    reference_tokens: int = 0
    """With N > 0 the judge first answers the prompt itself (greedy, at most N tokens, without seeing the completion) and that answer fills {reference} in template; 0: no reference."""
    reference_template: str = "{prompt}"
    """What the judge is asked for its own answer ({prompt} replaced): by default the prompt as the policy sees it."""
    chat: bool = True
    """Ask through the tokenizer's chat template (the question as the user message, the label as the reply's start); false, or no template: plain text."""
    batch_size: int = 8
    """Questions per forward pass (each with all its labels)."""
    cache: int = 65536
    """Distinct questions whose verdicts are kept per process (least recently used dropped first); 0: no cache."""
    max_length: int = 2048
    """Longest question in tokens, its longest label included; a longer one loses the start of its prompt, never the completion or the rest of the template (only a completion longer than max_length loses its start)."""
    device: str = "auto"
    """'auto' (cuda if available, else cpu), 'cpu', 'cuda' or 'cuda:N'."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the judge."""
    trust_remote_code: bool = False
    """Allow a checkpoint's own modelling code."""
    timeout_s: float = 600.0
    """Deadline of one call on the whole batch, loading the model included; past it the batch is unscorable."""

    def __post_init__(self) -> None:
        """Check the parameters and the checkpoint's config (not its weights)."""
        check_choices(self)
        if not self.template:
            object.__setattr__(self, "template", REFERENCE_TEMPLATE if self.reference_tokens > 0 else TEMPLATE)
        if self.device != "auto" and self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device: must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        _check_template(self.template, "template", ("prompt", "completion"))
        _check_template(self.pair_template, "pair_template", ("prompt", "first", "second"))
        _check_labels(self.labels, "labels")
        _check_labels(self.pair_labels, "pair_labels")
        if len(self.pair_labels) != 2:
            raise ValueError(f"pair_labels: needs exactly 2 (first better, second better), got {len(self.pair_labels)}")
        if len(self.scores) != len(self.labels):
            raise ValueError(f"scores: needs one score per label ({len(self.labels)}), got {len(self.scores)}")
        if not all(math.isfinite(s) for s in self.scores):
            raise ValueError(f"scores: must be finite numbers, got {list(self.scores)}")
        for key in ("batch_size", "max_length"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key}: must be >= 1, got {getattr(self, key)}")
        if self.reference_tokens < 0:
            raise ValueError(f"reference_tokens: must be >= 0 (0: no reference answer), got {self.reference_tokens}")
        if self.reference_tokens:
            _check_template(self.template, "template", ("prompt", "completion", "reference"))
            _check_template(self.reference_template, "reference_template", ("prompt",))
        elif "{reference}" in self.template:
            raise ValueError("template: {reference} is the judge's own answer, written only with reference_tokens > 0")
        if self.cache < 0:
            raise ValueError(f"cache: must be >= 0 (0: no cache), got {self.cache}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s}")
        config = read_checkpoint_config(self.path, "a causal LM saved with save_pretrained", self.trust_remote_code)
        if not any(a.endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or [])):
            raise ValueError(f"path: the model in {self.path!r} is not a causal LM "
                             f"(architectures {getattr(config, 'architectures', None)}); a judge answers in words")

    @property
    def deadline_s(self) -> float:
        """What ``score_batch`` allows one call (instead of ``reward.timeout_s``)."""
        return self.timeout_s

    def __call__(self, completions: Sequence[str], samples: Sequence[Mapping]) -> list[float]:
        """The expected label score of every (completion, sample)."""
        prompts = [prompt_text(s.get("prompt", "")) for s in samples]
        refs = self.references(prompts) if self.reference_tokens else [""] * len(prompts)
        questions = self.fitted(self.template, self.labels, prompts, completion=completions, reference=refs)
        dists = self.distributions(questions, self.labels)  # (B, L) log-probs
        return [float(sum(math.exp(lp) * s for lp, s in zip(d, self.scores))) for d in dists]

    def compare(self, prompts: Sequence, firsts: Sequence[str], seconds: Sequence[str]) -> list[float]:
        """P(first better than second) per triple, the mean of the two orders' verdicts (position bias cancels)."""
        texts = [prompt_text(p) for p in prompts]
        ab = self.fitted(self.pair_template, self.pair_labels, texts, first=firsts, second=seconds)
        ba = self.fitted(self.pair_template, self.pair_labels, texts, first=seconds, second=firsts)
        dists = self.distributions(ab + ba, self.pair_labels)
        n = len(ab)
        return [0.5 * (math.exp(dists[i][0]) + math.exp(dists[n + i][1])) for i in range(n)]

    def fitted(self, template: str, labels: tuple[str, ...], prompts: Sequence[str],
               **fields: Sequence[str]) -> list[str]:
        """``template`` filled with each prompt and the i-th of each of ``fields``; where the question and the
        longest label are over ``max_length`` tokens, the prompt loses its start (whole tokens, re-measured) until
        they fit, so that what a long question loses is never the completion or the template's own words."""
        tok = self._load()[1]
        label_ids = encode_labels(tok, labels, "labels" if labels == self.labels else "pair_labels")
        keep = max(self.max_length - max(map(len, label_ids)), 1)  # as distributions keeps
        out = []
        for i, prompt in enumerate(prompts):
            values = {k: v[i] for k, v in fields.items()}
            question = fill(template, prompt=prompt, **values)
            over = len(self._encode(tok, question)) - keep
            ids = tok(prompt, add_special_tokens=False)["input_ids"] if over > 0 else []
            while over > 0 and ids:
                ids = ids[over:]
                question = fill(template, prompt=tok.decode(ids, skip_special_tokens=True), **values)
                over = len(self._encode(tok, question)) - keep
            out.append(question)
        return out

    def distributions(self, questions: Sequence[str], labels: tuple[str, ...]) -> list[tuple[float, ...]]:
        """Per question, the log-probs of ``labels`` normalised over them; cached per distinct question."""
        cache = self._cache(labels)
        todo = list(dict.fromkeys(q for q in questions if q not in cache))  # distinct, not seen before
        if todo:
            model, tok = self._load()
            label_ids = encode_labels(tok, labels, "labels" if labels == self.labels else "pair_labels")
            keep = max(self.max_length - max(map(len, label_ids)), 1)  # question + longest label fit max_length
            ids = [self._encode(tok, q)[-keep:] for q in todo]  # over only where the completion alone is
            lp = sequence_logprobs(model, ids, label_ids, tok.pad_token_id, self.batch_size)  # (Q, L)
            fresh = dict(zip(todo, map(tuple, torch.log_softmax(lp, dim=-1).tolist())))
        else:
            fresh = {}
        out = [fresh[q] if q in fresh else cache[q] for q in questions]
        # a NaN verdict is not kept: the next call asks again
        _remember(cache, questions, {q: d for q, d in fresh.items() if all(map(math.isfinite, d))}, self.cache)
        return out

    def references(self, prompts: Sequence[str]) -> list[str]:
        """The judge's own answer to each prompt (``reference_template``, greedy, ``reference_tokens`` at most),
        computed once per distinct prompt and kept (``cache`` entries, least recently used dropped first)."""
        with _LOCK:
            kept = _REFERENCES.setdefault(self, OrderedDict())
            todo = [p for p in dict.fromkeys(prompts) if p not in kept]
        fresh = {}
        if todo:
            model, tok = self._load()
            keep = max(self.max_length - self.reference_tokens, 1)
            ids = [self._encode(tok, fill(self.reference_template, prompt=p))[-keep:] for p in todo]
            fresh = dict(zip(todo, greedy_answers(model, tok, ids, self.reference_tokens, self.batch_size)))
        out = [fresh[p] if p in fresh else kept[p] for p in prompts]
        _remember(kept, prompts, fresh, self.cache)
        return out

    def _encode(self, tok, question: str) -> list[int]:
        if self.chat and getattr(tok, "chat_template", None):
            text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False,
                                           add_generation_prompt=True)
            return tok(text, add_special_tokens=False)["input_ids"]
        return tok(question)["input_ids"]

    def _cache(self, labels: tuple[str, ...]) -> OrderedDict:
        with _LOCK:
            return _CACHES.setdefault((self, labels), OrderedDict())

    def _load(self):
        """The model and tokenizer, loaded once per process."""
        device = resolve_device(self.device)
        key = (str(Path(self.path).resolve()), str(device), self.dtype, self.trust_remote_code)
        with _LOCK:
            if key not in _LOADED:
                _LOADED[key] = load_judge(self.path, device, self.dtype, self.trust_remote_code)
            return _LOADED[key]


def _remember(cache: OrderedDict, used: Sequence, fresh: dict, limit: int) -> None:
    """``used`` keys become the most recently used, ``fresh`` entries join (``limit`` > 0) and the least recently
    used leave past ``limit`` entries (0: nothing is kept)."""
    with _LOCK:
        for key in used:
            if key in cache:
                cache.move_to_end(key)
        if limit:
            cache.update(fresh)
            while len(cache) > limit:
                cache.popitem(last=False)


def forget_cache() -> None:
    """Drop this process's cached verdicts (every judge's)."""
    with _LOCK:
        _CACHES.clear()
        _REFERENCES.clear()


def _check_template(template: str, key: str, fields: tuple[str, ...]) -> None:
    missing = [f for f in fields if "{" + f + "}" not in template]
    if missing:
        raise ValueError(f"{key}: must contain {', '.join('{' + f + '}' for f in fields)}; "
                         f"{', '.join('{' + f + '}' for f in missing)} missing")


def _check_labels(labels: tuple[str, ...], key: str) -> None:
    if len(labels) < 2:
        raise ValueError(f"{key}: needs at least 2 allowed answers, got {list(labels)}")
    if any(not x for x in labels):
        raise ValueError(f"{key}: an empty label; every label must be some text")
    if len(set(labels)) != len(labels):
        raise ValueError(f"{key}: labels must be distinct, got {list(labels)}")


def fill(template: str, **values: str) -> str:
    """``template`` with each ``{name}`` replaced by ``values[name]``, in one pass (a value holding ``{first}``
    stays as written).

    >>> fill("Q: {prompt} A: {completion}", prompt="{completion}?", completion="5")
    'Q: {completion}? A: 5'
    """
    return _FIELDS.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def prompt_text(prompt) -> str:
    """A sample's prompt as the judge reads it: text as is, chat messages' contents joined by newlines.

    >>> prompt_text(({"role": "user", "content": "max(1,7,3)=?"},))
    'max(1,7,3)=?'
    """
    if isinstance(prompt, (tuple, list)):
        return "\n".join(str(m.get("content", "")) for m in prompt)
    return str(prompt)


def encode_labels(tok, labels: Sequence[str], key: str = "labels") -> list[list[int]]:
    """The token ids of each label (no special tokens); a ValueError naming ``key`` when one has none or two
    labels are the same tokens."""
    ids = [tok(x, add_special_tokens=False)["input_ids"] for x in labels]
    for x, i in zip(labels, ids):
        if not i:
            raise ValueError(f"{key}: {x!r} is no tokens for this judge's tokenizer")
    seen: dict[tuple, str] = {}
    for x, i in zip(labels, ids):
        if tuple(i) in seen:
            raise ValueError(f"{key}: {seen[tuple(i)]!r} and {x!r} are the same tokens for this judge's tokenizer")
        seen[tuple(i)] = x
    return ids


def greedy_answers(model, tok, question_ids: list[list[int]], max_new_tokens: int, batch_size: int) -> list[str]:
    """What the model answers to each question, greedily, up to ``max_new_tokens`` tokens or its end of turn (the
    tokenizer's eos and the model's generation eos ids), decoded without special tokens, ``batch_size`` at a time."""
    stops = eos_ids(model, tok)
    device = next(model.parameters()).device
    out: list[str] = []
    for start in range(0, len(question_ids), batch_size):
        p_ids, p_mask, _ = pad_batch(question_ids[start:start + batch_size], tok.pad_token_id, "left")  # (b, T)
        with torch.inference_mode():
            rows = model.generate(input_ids=p_ids.to(device), attention_mask=p_mask.to(device), do_sample=False,
                                  max_new_tokens=max_new_tokens, eos_token_id=stops,
                                  pad_token_id=tok.pad_token_id)[:, p_ids.shape[1]:].tolist()  # (b, <= N)
        for row in rows:
            ends = [i for i, t in enumerate(row) if t in stops]
            out.append(tok.decode(row[:ends[0]] if ends else row, skip_special_tokens=True))
    return out


def sequence_logprobs(model, question_ids: list[list[int]], label_ids: list[list[int]], pad_id: int,
                      batch_size: int) -> torch.Tensor:
    """log p(label_j | question_i) (Q, L), each label's tokens summed, ``batch_size`` questions per forward.

    Questions are left-padded and labels right-padded (positions count from the first real token); rows of one
    question are consecutive, so their prompt is computed once where the model takes a KV cache.
    """
    L = len(label_ids)
    out = []
    for start in range(0, len(question_ids), batch_size):
        chunk = question_ids[start:start + batch_size]
        p_ids, p_mask, _ = pad_batch([q for q in chunk for _ in range(L)], pad_id, "left")  # (N, Tp)
        r_ids, r_mask, _ = pad_batch([lab for _ in chunk for lab in label_ids], pad_id, "right")  # (N, T)
        with torch.inference_mode():
            logp = response_logprobs(model, p_ids, p_mask, r_ids, r_mask)[0].float().cpu()  # (N, T)
        out.append(torch.where(r_mask.bool(), logp, 0.0).sum(-1).view(len(chunk), L))  # (q, L)
    return torch.cat(out) if out else torch.zeros(0, L)


def load_judge(path: str, device: torch.device, dtype: str, trust_remote_code: bool = False):
    """(causal LM in eval mode on ``device``, tokenizer with a pad token): the policy's loaders."""
    tok = load_tokenizer(path, trust_remote_code)
    model = load_model(path, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
    return model.eval(), tok
