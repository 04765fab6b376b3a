"""Several roles on one base model (multi-agent RFT, issue 32): one LoRA adapter per role, PEFT's named adapters.

* ``with_roles(model, roles, lora)`` puts one adapter per role on a plain causal LM, named by the role. The base
  weights are held once and never train; a ``frozen`` role's adapter never requires a gradient and never changes.
* ``acting(model, role)`` makes ``role``'s adapter the one every forward pass runs through (sampling or training)
  and gives the previous one back afterwards, even when its body raises. It changes no ``requires_grad``: PEFT's
  ``set_adapter`` makes the adapter it activates trainable and every other one untrainable (peft 0.21.2,
  ``BaseTuner.set_adapter``), so ``acting`` puts the roles' own setting back (every unfrozen role trainable,
  every frozen one not) before the body runs. A loss computed under one role therefore reaches only that role's
  adapter (the others take no part in the forward and get no gradient), and losses of several roles can be summed
  or accumulated before one ``optimizer.step()``.
* ``role_parameters(model)``: each unfrozen role's adapter parameters, for ONE optimizer over every trained role.
* ``save_roles(model, path)`` writes each role's adapter in PEFT's format into ``path/<role>/`` (its
  ``adapter_config.json`` records the base model's path, as PEFT does) and ``roles.json`` (the roles in order, the
  frozen ones); ``load_roles(base, path)`` puts them back onto the base, tensor for tensor
  (``rlft.models.loading.load_policy(path, ...)`` loads the base and the roles at once). Writing the directory
  whole (a temporary sibling, renamed) is left to the caller, as rlft.runs.checkpoint does for a checkpoint.
* The reference policy of a KL term stays the base: ``AdaptersOff(model)`` (rlft.models.lora) disables every
  adapter at once.

Role names are the adapters' names in PEFT and directory names on disk, so they are plain words
(``[A-Za-z][A-Za-z0-9_-]*``), not ``default`` (PEFT saves that one outside its sub-directory), ``base_layer`` or
``base_model``, not in PEFT's ``lora_`` prefix, and not the name of a module of the model: PEFT picks an adapter's
tensors out of the state dict by ``.<name>.``, so a role called ``mlp`` silently drops the other roles' MLP adapters
from their saved files (checked on peft 0.21.2: they load back as freshly initialised).
"""

from __future__ import annotations

import json
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from rlft.models.lora import adapter_base, core_model, is_adapter_dir, is_peft, peft_lora_config

MANIFEST = "roles.json"
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_PEFT_NAMES = ("default", "base_layer", "base_model")  # PEFT's default adapter, module names PEFT adds


@dataclass(frozen=True)
class Roles:
    """The roles on a model: their names in order (the first is active outside ``acting``) and the frozen ones."""

    names: tuple[str, ...]
    frozen: frozenset[str] = frozenset()

    @property
    def trained(self) -> tuple[str, ...]:
        return tuple(r for r in self.names if r not in self.frozen)


def with_roles(model, roles: Sequence[str], lora, frozen: Sequence[str] = ()):
    """A PEFT model: ``model`` (a plain causal LM) with one LoRA adapter per role from the ``lora`` config section
    (rlft.config.sections.LoraConfig), each named by its role; the first role is active. Only the adapters of
    the roles not in ``frozen`` require gradients. A new adapter starts as a no-op (LoRA's B is zero), so a
    frozen role made here acts as the base; ``load_roles`` brings back trained ones."""
    from peft import get_peft_model

    if is_peft(model):
        raise ValueError("with_roles: the model already has PEFT adapters; give it the plain base model")
    if lora.rank <= 0:
        raise ValueError(f"lora.rank={lora.rank}: roles are LoRA adapters, so lora.rank must be > 0")
    spec = _checked(roles, frozen, core_model(model))
    config = peft_lora_config(lora)
    try:
        model = get_peft_model(model, config, adapter_name=spec.names[0])
        for role in spec.names[1:]:
            model.add_adapter(role, peft_lora_config(lora))
    except ValueError as e:  # PEFT: a target module not found in the model
        raise ValueError(f"lora.target_modules {list(lora.target_modules)}: {e}") from None
    return _hold(model, spec)


def roles_of(model) -> Roles:
    """The roles ``with_roles`` or ``load_roles`` put on ``model``."""
    spec = getattr(model, "_rlft_roles", None)
    if spec is None:
        raise ValueError("this model has no roles; build it with rlft.models.roles.with_roles or load_roles")
    return spec


@contextmanager
def acting(model, role: str) -> Iterator:
    """Within the block, forward passes of ``model`` run through ``role``'s adapter; the adapter active before
    is active again after (also when the block raises). Which adapters train does not change."""
    spec = roles_of(model)
    if role not in spec.names:
        raise ValueError(f"unknown role {role!r}; this model's roles are {list(spec.names)}")
    before = model.active_adapter
    _activate(model, role, spec)
    try:
        yield model
    finally:
        _activate(model, before, spec)


def in_role(model, role: str, fn: Callable) -> Callable:
    """``fn`` (a sampler of ``model``, say), each call run under ``role``'s adapter (``acting``)."""
    def call(*args, **kwargs):
        with acting(model, role):
            return fn(*args, **kwargs)

    return call


def active_role(model) -> str:
    """The role whose adapter forward passes run through now."""
    roles_of(model)
    return model.active_adapter


def has_roles(model) -> bool:
    """Whether ``model`` carries roles (``with_roles`` or ``load_roles``)."""
    return getattr(model, "_rlft_roles", None) is not None


def by_role(model, token_roles: torch.Tensor, forward: Callable[[torch.Tensor], tuple[torch.Tensor, ...]]
            ) -> tuple[torch.Tensor | None, ...]:
    """Per-token outputs of a batch whose tokens different roles wrote, each token's from its own role's pass.

    ``token_roles`` (B, T): the index (in ``roles_of(model).names``) of the role that wrote each token, -1 for
    none; ``forward(rows)`` runs the model over the batch's rows ``rows`` (a 1-D index) and returns tensors of
    shape (len(rows), T) (None entries pass through as None). It runs once per role that wrote a token, under that
    role's adapter and on the rows where it did; each output is then the sum over roles of the role's values at
    its own tokens (0 where no role wrote), so gradients reach each role's adapter through its tokens only."""
    names = roles_of(model).names
    out: list[torch.Tensor | None] | None = None
    for k, name in enumerate(names):
        mine = token_roles == k  # (B, T)
        rows = mine.any(1).nonzero().squeeze(1)  # (b,)
        if not len(rows):
            continue
        with acting(model, name):
            parts = forward(rows)
        if out is None:
            out = [None if p is None else torch.zeros((len(token_roles), *p.shape[1:]), dtype=p.dtype,
                                                      device=p.device) for p in parts]
        for j, p in enumerate(parts):
            if p is not None:
                keep = mine[rows].to(p.device)  # (b, T)
                out[j] = out[j].index_add(0, rows.to(p.device), torch.where(keep, p, torch.zeros_like(p)))
    if out is None:  # no role wrote a token: every output is zero, from one pass of the first role
        with acting(model, names[0]):
            parts = forward(torch.arange(len(token_roles)))
        out = [None if p is None else p * 0 for p in parts]
    return tuple(out)


def role_parameters(model) -> dict[str, list[torch.nn.Parameter]]:
    """Each unfrozen role's adapter parameters (frozen roles have no entry), in the order of ``roles_of(model)``:
    ``torch.optim.AdamW([p for ps in role_parameters(m).values() for p in ps])`` trains every role at once, or
    one parameter group per role for per-role learning rates."""
    spec = roles_of(model)
    return {role: adapter_parameters(model, role) for role in spec.trained}


def adapter_parameters(model, role: str) -> list[torch.nn.Parameter]:
    """The parameters of ``role``'s adapter, frozen or not, found through PEFT's adapter layers (not by name)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    found: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            for attr in module.adapter_layer_names:
                held = getattr(module, attr)
                if role in held:
                    part = held[role]
                    for p in [part] if isinstance(part, torch.nn.Parameter) else part.parameters():
                        found.setdefault(id(p), p)
    return list(found.values())


def save_roles(model, path: str | Path) -> Path:
    """Every role's adapter into ``path/<role>/`` (PEFT's format, with the base model's path in its
    ``adapter_config.json``) and the roles (order, frozen ones) into ``path/roles.json``, written last."""
    spec, path = roles_of(model), Path(path)
    model.save_pretrained(str(path), selected_adapters=list(spec.names))
    manifest = {"roles": list(spec.names), "frozen": [r for r in spec.names if r in spec.frozen]}
    (path / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return path


def load_roles(base, path: str | Path, roles: Sequence[str] | None = None, frozen: Sequence[str] | None = None):
    """The roles saved at ``path`` on ``base``, the plain base model (``base_dir(path)`` names the directory the
    saved adapters record; rlft.models.loading.load_policy loads a saved roles directory whole). ``roles``: which
    to load and in what order (None: all, as saved); ``frozen``: which of them are frozen (None: those saved
    frozen)."""
    from peft import PeftModel

    path = Path(path)
    saved = _manifest(path)
    if roles is None:
        if saved is None:
            raise ValueError(f"{path}: no {MANIFEST}; name the roles to load")
        roles = saved.names
    if frozen is None:
        frozen = [r for r in roles if saved is not None and r in saved.frozen]
    for role in roles:
        if not is_adapter_dir(path / role):
            raise ValueError(f"role {role!r}: no adapter at {path / role} (roles saved there: "
                             f"{sorted(p.name for p in path.iterdir() if is_adapter_dir(p)) if path.is_dir() else []})")
    if is_peft(base):
        raise ValueError("load_roles: the base model already has PEFT adapters; give it the plain base model")
    spec = _checked(roles, frozen, core_model(base))
    model = PeftModel.from_pretrained(base, str(path / spec.names[0]), adapter_name=spec.names[0], is_trainable=True)
    for role in spec.names[1:]:
        model.load_adapter(str(path / role), adapter_name=role, is_trainable=True)
    return _hold(model, spec)


def is_roles_dir(path: str | Path) -> bool:
    """Whether ``path`` holds roles saved by ``save_roles`` (its ``roles.json``)."""
    return (Path(path) / MANIFEST).is_file()


def base_dir(path: str | Path) -> str:
    """The base model directory the roles saved at ``path`` were trained on (their first adapter records it)."""
    saved = _manifest(Path(path))
    if saved is None:
        raise ValueError(f"{path}: no {MANIFEST}: not a directory of roles")
    return adapter_base(Path(path) / saved.names[0])


def _manifest(path: Path) -> Roles | None:
    file = path / MANIFEST
    if not file.is_file():
        return None
    saved = json.loads(file.read_text())
    return Roles(tuple(saved["roles"]), frozenset(saved.get("frozen", ())))


def _checked(roles: Sequence[str], frozen: Sequence[str], core) -> Roles:
    """``Roles`` after checking the names against the rules of the module docstring and the model's modules."""
    if isinstance(roles, str) or isinstance(frozen, str):
        raise ValueError(f"roles and frozen are lists of names, not one string ({roles!r}, {frozen!r})")
    roles, frozen = tuple(roles), tuple(frozen)
    if not roles:
        raise ValueError("roles: name at least one role")
    dupes = sorted({r for r in roles if roles.count(r) > 1})
    if dupes:
        raise ValueError(f"roles {list(roles)}: {dupes} named more than once")
    modules = {part for name, _ in core.named_modules() for part in name.split(".")}
    for role in roles:
        if not isinstance(role, str) or not _NAME.fullmatch(role):
            raise ValueError(f"role {role!r}: a role name is a letter followed by letters, digits, '_' or '-'")
        if role in _PEFT_NAMES or role in "lora_" or role.startswith("lora_") or role in modules:
            why = ("a name PEFT uses itself" if role in _PEFT_NAMES else
                   "a name in PEFT's prefix 'lora_'" if role in "lora_" or role.startswith("lora_") else
                   "the name of a module of the model")
            raise ValueError(f"role {role!r}: {why}; PEFT would not keep its adapter apart, choose another name")
    unknown = [r for r in frozen if r not in roles]
    if unknown:
        raise ValueError(f"frozen roles {unknown} are not among the roles {list(roles)}")
    return Roles(roles, frozenset(frozen))


def _hold(model, spec: Roles):
    """``model`` holding ``spec``, its first role active, every adapter's ``requires_grad`` as ``spec`` says."""
    model._rlft_roles = spec
    _activate(model, spec.names[0], spec)
    return model


def _activate(model, role: str, spec: Roles) -> None:
    """``role``'s adapter active; then the trainable flags PEFT's set_adapter rewrote set back from ``spec``."""
    model.set_adapter(role)
    for name in spec.names:
        for p in adapter_parameters(model, name):
            p.requires_grad_(name not in spec.frozen)
