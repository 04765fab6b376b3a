"""PPO-ptx: a pretraining language-modelling loss mixed into the RL update (InstructGPT, Ouyang et al. 2022, eq. 2).

The texts come from ``data.ptx_source``:

- a jsonl / json / parquet file or directory (``train`` split), one text per row
  in ``data.ptx_text_key``; every token after the first carries the loss;
- ``task`` (``TASK_SOURCE``): the run's own training rows, each rendered exactly
  as the SFT stage renders it (prompt through ``data.template`` with
  ``sft.system_prompt``, then the reference response and eos), with the SFT
  stage's loss mask (``sft.loss_on``). The ptx term is then the SFT loss on the
  task's reference answers, kept in every PPO update.

Each text is cut to ``data.ptx_max_tokens`` tokens. Each optimizer step draws
``train.ptx_batch_size`` of them from a seeded generator whose state is
checkpointed.

The loss's log-probs come from the final hidden states and the output projection, ``chunk`` tokens at a time,
without the full logits, where the model allows it (``rlft.models.forward.next_token_logprobs``, as the RL
update's log-probs; ``chunk`` = 0: the full logits).
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.core.losses import sft_loss
from rlft.core.ops import masked_sum
from rlft.data.loaders import load_rows
from rlft.data.schema import DataError
from rlft.models.forward import LOGPROB_CHUNK, next_token_logprobs
from rlft.rollout.batch import right_pad


TASK_SOURCE = "task"
"""``data.ptx_source`` value that means the run's training rows rendered as the SFT stage renders them."""


def file_texts(source: str, text_key: str, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """(ids, loss weights) of the texts of a ptx file: every token carries the loss."""
    rows = load_rows(source, "train")
    ids = []
    for i, row in enumerate(rows):
        text = row.get(text_key) if isinstance(row, dict) else None
        if not isinstance(text, str) or not text:
            raise DataError(f"data.ptx_source {source}: row {i} has no non-empty string field {text_key!r}")
        ids.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids, [[1] * len(x) for x in ids]


def task_texts(examples, tokenizer, cfg) -> tuple[list[list[int]], list[list[int]]]:
    """(ids, loss weights) of the training rows as SFT renders them: prompt ids then response ids (with eos), and
    per token the weight of predicting it (the SFT mask of ``sft.loss_on``; 0 on the prompt unless ``all``)."""
    from rlft.data.sft_data import sft_rows
    from rlft.trainers.sft import sft_pairs

    items = sft_pairs(sft_rows(list(examples), cfg), tokenizer, cfg)
    return [p + t for p, t, _ in items], [[0] * len(p) + w for p, _, w in items]


class PtxData:
    """The ptx texts as token ids with a 0/1 loss weight per token (the weight of predicting that token)."""

    def __init__(self, ids: list[list[int]], weights: list[list[int]], source: str, max_tokens: int, pad_id: int,
                 batch_size: int, seed: int):
        if not ids:
            raise DataError(f"data.ptx_source {source}: no rows")
        self.ids = [x[:max_tokens] for x in ids]
        self.weights = [w[:max_tokens] for w in weights]
        empty = [i for i, w in enumerate(self.weights) if sum(w[1:]) == 0]  # the first token is never predicted
        if empty:
            raise DataError(f"data.ptx_source {source}: row {empty[0]} has no token to predict within "
                            f"data.ptx_max_tokens={max_tokens}")
        self.pad_id = pad_id
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)

    @classmethod
    def from_config(cls, cfg, tokenizer, examples) -> "PtxData":
        """The ptx data of ``data.ptx_source``: a file, or ``task`` (``examples`` rendered as SFT renders them)."""
        d = cfg.data
        if d.ptx_source == TASK_SOURCE:
            ids, weights = task_texts(examples, tokenizer, cfg)
        else:
            ids, weights = file_texts(d.ptx_source, d.ptx_text_key, tokenizer)
        return cls(ids, weights, d.ptx_source, d.ptx_max_tokens, tokenizer.pad_token_id, cfg.train.ptx_batch_size,
                   cfg.train.seed)

    def sample(self) -> tuple[Tensor, Tensor, Tensor]:
        """(ids, mask, weights) (b, L) of a random batch of texts, right-padded (weights 0 on padding)."""
        idx = torch.randint(len(self.ids), (self.batch_size,), generator=self.gen).tolist()
        ids, mask = right_pad([self.ids[i] for i in idx], self.pad_id)
        weights, _ = right_pad([self.weights[i] for i in idx], 0)
        return ids, mask, weights

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])


def lm_loss(model, ids: Tensor, mask: Tensor, weights: Tensor | None = None, *,
            chunk: int = LOGPROB_CHUNK) -> Tensor:
    """Token-mean next-token NLL of ``ids`` under ``model`` over the tokens after the first whose ``weights`` are 1
    (default: every non-padding token); ``chunk``: tokens per block of the log-prob head (0: the full logits)."""
    logp, keep = _lm_logprobs(model, ids, mask, weights, chunk)
    return sft_loss(logp, keep)


def lm_loss_sum(model, ids: Tensor, mask: Tensor, weights: Tensor | None = None, *,
                chunk: int = LOGPROB_CHUNK) -> Tensor:
    """The numerator of ``lm_loss``: the summed NLL over the same tokens (``lm_loss`` = this / ``lm_tokens``)."""
    logp, keep = _lm_logprobs(model, ids, mask, weights, chunk)
    return masked_sum(-logp, keep)


def lm_tokens(mask: Tensor, weights: Tensor | None = None) -> float:
    """The number of tokens ``lm_loss`` averages over (at least 1)."""
    weights = mask if weights is None else weights
    return max(float((weights[:, 1:] * mask[:, 1:]).sum()), 1.0)


def _lm_logprobs(model, ids: Tensor, mask: Tensor, weights: Tensor | None, chunk: int) -> tuple[Tensor, Tensor]:
    """(log-prob of each next token (b, L-1), its 0/1 loss weight (b, L-1))."""
    device = next(model.parameters()).device
    mask = mask.to(device)
    weights = mask if weights is None else weights.to(device)
    keep = (weights[:, 1:] * mask[:, 1:]).float()  # (b, L-1)
    return next_token_logprobs(model, ids, mask, keep, chunk=chunk), keep
