"""PPO-ptx: a pretraining language-modelling loss mixed into the RL update (InstructGPT, Ouyang et al. 2022, eq. 2).

The texts come from ``data.ptx_source`` (jsonl / json / parquet file or directory,
``train`` split), one text per row in ``data.ptx_text_key``, cut to
``data.ptx_max_tokens`` tokens. Each optimizer step draws ``train.ptx_batch_size``
of them from a seeded generator whose state is checkpointed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rlft.core.losses import sft_loss
from rlft.core.ops import logprobs_from_logits
from rlft.data.loaders import load_rows
from rlft.data.schema import DataError
from rlft.rollout.batch import right_pad


class PtxData:
    def __init__(self, source: str, text_key: str, max_tokens: int, tokenizer, batch_size: int, seed: int):
        rows = load_rows(source, "train")
        texts = []
        for i, row in enumerate(rows):
            text = row.get(text_key) if isinstance(row, dict) else None
            if not isinstance(text, str) or not text:
                raise DataError(f"data.ptx_source {source}: row {i} has no non-empty string field {text_key!r}")
            texts.append(text)
        if not texts:
            raise DataError(f"data.ptx_source {source}: no rows")
        self.ids = [tokenizer(t, add_special_tokens=False)["input_ids"][:max_tokens] for t in texts]
        short = [i for i, x in enumerate(self.ids) if len(x) < 2]
        if short:
            raise DataError(f"data.ptx_source {source}: row {short[0]} has fewer than 2 tokens (nothing to predict)")
        self.pad_id = tokenizer.pad_token_id
        self.batch_size = batch_size
        self.gen = torch.Generator().manual_seed(seed)

    def sample(self) -> tuple[Tensor, Tensor]:
        """(ids, mask) (b, L) of a random batch of texts, right-padded."""
        idx = torch.randint(len(self.ids), (self.batch_size,), generator=self.gen).tolist()
        return right_pad([self.ids[i] for i in idx], self.pad_id)

    def state_dict(self) -> dict:
        return {"gen": self.gen.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.gen.set_state(state["gen"])


def lm_loss(model, ids: Tensor, mask: Tensor) -> Tensor:
    """Token-mean next-token NLL of ``ids`` under ``model`` (every token after the first)."""
    device = next(model.parameters()).device
    ids, mask = ids.to(device), mask.to(device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]  # (b, L-1, V)
    logp = logprobs_from_logits(logits, ids[:, 1:])  # (b, L-1)
    return sft_loss(logp, mask[:, 1:].float())
