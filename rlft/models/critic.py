"""The critic: a causal-LM backbone (no LM head) with a scalar value head, a model separate from the policy.

``values(...)`` returns V(s_t) for every response position t, where s_t is the
prompt plus the first t response tokens: the hidden state at the same positions
whose logits score the response tokens in :func:`rlft.models.forward.response_logprobs`.

Saved as ``save_pretrained`` of the backbone plus ``value_head.pt``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from rlft.models.loading import DTYPES

VALUE_HEAD = "value_head.pt"


class Critic(nn.Module):
    def __init__(self, backbone: nn.Module, head: nn.Linear | None = None):
        super().__init__()
        self.backbone = backbone
        hidden = backbone.config.hidden_size
        param = next(backbone.parameters())
        self.head = head if head is not None else nn.Linear(hidden, 1, dtype=param.dtype, device=param.device)
        if head is None:
            nn.init.zeros_(self.head.weight)  # V = bias = 0 at the start: no arbitrary initial value estimates
            nn.init.zeros_(self.head.bias)

    def values(self, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor) -> Tensor:
        """V(s_t) (B, T) in float32, one per response token: a call of the module, so that the hooks of a
        sharding wrapper (FSDP) run."""
        return self(prompt_ids, prompt_mask, response_ids, response_mask)

    def forward(self, prompt_ids: Tensor, prompt_mask: Tensor, response_ids: Tensor, response_mask: Tensor) -> Tensor:
        """See ``values``."""
        device = next(self.parameters()).device
        input_ids = torch.cat([prompt_ids, response_ids], dim=1).to(device)  # (B, Tp + T)
        attn = torch.cat([prompt_mask, response_mask], dim=1).to(device)  # (B, Tp + T)
        position_ids = (attn.cumsum(-1) - 1).clamp(min=0)
        hidden = self.backbone(input_ids=input_ids, attention_mask=attn, position_ids=position_ids,
                               use_cache=False).last_hidden_state  # (B, Tp + T, H)
        T = response_ids.shape[1]
        h = hidden[:, -(T + 1):-1]  # (B, T, H): the state before response token t
        return self.head(h).squeeze(-1).float()  # (B, T)

    def save_pretrained(self, path: str | Path, state_dict: dict[str, Tensor] | None = None) -> None:
        """The backbone's ``save_pretrained`` and the head's weights; ``state_dict``: the whole critic's weights to
        write instead of its own (a sharded critic's, gathered)."""
        path = Path(path)
        if state_dict is None:
            self.backbone.save_pretrained(path)
            torch.save(self.head.state_dict(), path / VALUE_HEAD)
            return
        part = {name: {k[len(name) + 1:]: v for k, v in state_dict.items() if k.startswith(name + ".")}
                for name in ("backbone", "head")}
        self.backbone.save_pretrained(path, state_dict=part["backbone"])
        torch.save(part["head"], path / VALUE_HEAD)


def load_critic(path: str, *, dtype: str = "float32", device: torch.device | str = "cpu",
                trust_remote_code: bool = False) -> Critic:
    """A critic from a causal-LM directory (new zero value head) or a saved critic (with its head)."""
    from transformers import AutoModel

    backbone = AutoModel.from_pretrained(path, dtype=DTYPES[dtype], trust_remote_code=trust_remote_code).to(device)
    head_file = Path(path) / VALUE_HEAD
    head = None
    if head_file.is_file():
        param = next(backbone.parameters())
        head = nn.Linear(backbone.config.hidden_size, 1, dtype=param.dtype, device=param.device)
        head.load_state_dict(torch.load(head_file, map_location=param.device, weights_only=True))
    return Critic(backbone, head)
