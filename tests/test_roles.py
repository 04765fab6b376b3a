"""Several roles on one base (issue 32, multi-agent RFT): one LoRA adapter per role, acting switches the adapter
forward passes use without changing what trains, gradients stay within the acting role, one optimizer moves every
unfrozen role and nothing else, frozen roles never move, and the roles save and load back tensor for tensor."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("peft", reason="roles need the lora extra (pip install -e '.[lora]')")

from rlft.config.sections import LoraConfig  # noqa: E402
from rlft.models.loading import load_model  # noqa: E402
from rlft.models.lora import AdaptersOff, add_lora, is_adapter_dir  # noqa: E402
from rlft.models.roles import (acting, active_role, adapter_parameters, base_dir, load_roles, role_parameters,  # noqa: E402
                               roles_of, save_roles, with_roles)
from numerics import FORWARD_DEPTH, assert_rounding_close, rounding_differs  # noqa: E402

LORA = LoraConfig(rank=4, alpha=8.0)
ROLES = ("solver", "verifier")


def perturb(model, role: str, seed: int) -> None:
    """LoRA's B starts at 0 (a new adapter is a no-op): give every weight of ``role``'s adapter a random value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in adapter_parameters(model, role):
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def two_roles(model_dir, frozen=()):
    model = with_roles(load_model(str(model_dir)), ROLES, LORA, frozen=frozen)
    for seed, role in enumerate(ROLES):
        perturb(model, role, seed)
    return model


def tokens(model, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, model.config.vocab_size, (2, 9), generator=g)  # (B, T), no special tokens


def loss_of(model, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits  # (B, T, V)


def tol(model, ids: torch.Tensor, z: torch.Tensor) -> dict:
    c = model.config
    n = max(c.vocab_size, c.intermediate_size, c.hidden_size, ids.numel())
    return dict(n_terms=n, scale=1 + z.abs().max().item(), depth=FORWARD_DEPTH)


def flags(model) -> dict[str, bool]:
    return {n: p.requires_grad for n, p in model.named_parameters()}


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


def role_of(name: str) -> str | None:
    """The role of a parameter named ``...lora_A.<role>.weight`` (None: a base weight)."""
    return next((r for r in ROLES if f".{r}." in name), None)


def test_each_role_acts_through_its_own_adapter_as_a_one_adapter_model_would(tiny_model_dir):
    model = two_roles(tiny_model_dir)
    ids = tokens(model)
    named = dict(model.named_parameters())
    out = {}
    for role in ROLES:
        with acting(model, role):
            assert active_role(model) == role
            out[role] = logits(model, ids)
        single = add_lora(load_model(str(tiny_model_dir)), LORA)  # PEFT's one adapter, "default"
        with torch.no_grad():
            for name, p in single.named_parameters():
                if "lora_" in name:
                    p.copy_(named[name.replace(".default.", f".{role}.")])
        assert_rounding_close(out[role], logits(single, ids), **tol(model, ids, out[role]), what=f"{role} logits")
    assert rounding_differs(out["solver"], out["verifier"], **tol(model, ids, out["solver"]))
    assert active_role(model) == "solver"  # the first role, active again after each block
    base = load_model(str(tiny_model_dir))
    assert torch.equal(logits(AdaptersOff(model), ids), logits(base, ids))  # the KL reference is the base


def test_acting_changes_no_requires_grad_where_peft_set_adapter_does(tiny_model_dir):
    model = two_roles(tiny_model_dir)
    before = flags(model)
    assert all(v == (role_of(n) is not None) for n, v in before.items())  # both roles train, the base does not
    for role in ROLES:
        with acting(model, role):
            assert flags(model) == before
        assert flags(model) == before
    model.set_adapter("verifier")  # what acting works around (peft 0.21.2): the inactive adapter is frozen
    assert not any(p.requires_grad for p in adapter_parameters(model, "solver"))


def test_a_loss_reaches_only_its_role_and_one_step_moves_both_roles_and_nothing_else(tiny_model_dir):
    torch.manual_seed(0)
    model = two_roles(tiny_model_dir)
    params = role_parameters(model)
    assert list(params) == list(ROLES)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    assert trainable == {id(p) for ps in params.values() for p in ps}
    optimizer = torch.optim.AdamW([p for ps in params.values() for p in ps], lr=1e-2)
    named, base = dict(model.named_parameters()), base_weights(model)
    ids = tokens(model)

    with acting(model, "solver"):
        loss_of(model, ids).backward()
    for name, p in named.items():
        if role_of(name) == "solver":
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        else:
            assert p.grad is None or not p.grad.any(), name  # the verifier's adapter and every base weight
    solver_grads = {n: p.grad.clone() for n, p in named.items() if role_of(n) == "solver"}

    with acting(model, "verifier"):
        loss_of(model, tokens(model, 1)).backward()
    for name, p in named.items():
        if role_of(name) == "verifier":
            assert p.grad is not None and p.grad.abs().sum() > 0, name
        elif role_of(name) == "solver":
            assert torch.equal(p.grad, solver_grads[name]), name  # the verifier's loss added nothing to it
        else:
            assert p.grad is None, name

    adapters = {n: p.detach().clone() for n, p in named.items() if role_of(n)}
    optimizer.step()
    assert all(not torch.equal(named[n], v) for n, v in adapters.items())  # every adapter weight of both roles
    assert all(torch.equal(named[n], v) for n, v in base.items())  # the base, bit for bit


def test_losses_of_both_roles_in_one_backward_give_each_role_its_own_gradient(tiny_model_dir):
    """An episode's roles summed into one loss: each role's gradient is the one its own loss gives alone."""
    model = two_roles(tiny_model_dir)
    named = dict(model.named_parameters())
    ids = {role: tokens(model, seed) for seed, role in enumerate(ROLES)}
    alone = {}
    for role in ROLES:
        model.zero_grad()
        with acting(model, role):
            loss_of(model, ids[role]).backward()
        alone.update({n: p.grad.clone() for n, p in named.items() if role_of(n) == role})
    model.zero_grad()
    total = 0
    for role in ROLES:
        with acting(model, role):
            total = total + loss_of(model, ids[role])
    total.backward()
    assert all(torch.equal(named[n].grad, g) for n, g in alone.items())


def test_a_frozen_role_acts_but_never_trains(tiny_model_dir):
    model = two_roles(tiny_model_dir, frozen=["verifier"])
    frozen = adapter_parameters(model, "verifier")
    assert roles_of(model).trained == ("solver",) and list(role_parameters(model)) == ["solver"]
    assert frozen and not any(p.requires_grad for p in frozen)
    kept = [p.detach().clone() for p in frozen]
    ids = tokens(model)
    with acting(model, "verifier"):
        assert not any(p.requires_grad for p in frozen)  # PEFT's set_adapter would have made them trainable
        verifier_logits = logits(model, ids)
    base = load_model(str(tiny_model_dir))
    assert rounding_differs(verifier_logits, logits(base, ids), **tol(model, ids, verifier_logits))  # it acts
    optimizer = torch.optim.AdamW(role_parameters(model)["solver"], lr=1e-2, weight_decay=0.1)
    solver = [p.detach().clone() for p in adapter_parameters(model, "solver")]
    for step in range(2):
        optimizer.zero_grad()
        total = 0
        for role in ("verifier", "solver"):
            with acting(model, role):
                total = total + loss_of(model, tokens(model, step))
        total.backward()
        assert all(p.grad is None for p in frozen)
        optimizer.step()
    assert all(torch.equal(p, k) for p, k in zip(frozen, kept))
    assert all(not torch.equal(p, k) for p, k in zip(adapter_parameters(model, "solver"), solver))


def test_acting_gives_the_previous_role_back_when_its_body_raises(tiny_model_dir):
    model = two_roles(tiny_model_dir, frozen=["verifier"])
    before = flags(model)
    with pytest.raises(RuntimeError, match="boom"):
        with acting(model, "verifier"):
            with acting(model, "solver"):
                assert active_role(model) == "solver"
            assert active_role(model) == "verifier"
            raise RuntimeError("boom")
    assert active_role(model) == "solver" and flags(model) == before


def test_saved_roles_load_back_tensor_equal_with_frozen_roles_frozen(tiny_model_dir, tmp_path):
    model = two_roles(tiny_model_dir, frozen=["verifier"])
    out = save_roles(model, tmp_path / "roles")
    assert all(is_adapter_dir(out / role) for role in ROLES) and not is_adapter_dir(out)
    assert json.loads((out / "roles.json").read_text()) == {"roles": list(ROLES), "frozen": ["verifier"]}
    for role in ROLES:
        recorded = json.loads((out / role / "adapter_config.json").read_text())["base_model_name_or_path"]
        assert recorded == str(tiny_model_dir)

    loaded = load_roles(load_model(base_dir(out)), out)  # the base the adapters record, every role as saved
    assert roles_of(loaded) == roles_of(model) and active_role(loaded) == "solver"
    for role in ROLES:
        mine, theirs = adapter_parameters(model, role), adapter_parameters(loaded, role)
        assert len(mine) == len(theirs) > 0
        assert all(torch.equal(a, b) for a, b in zip(mine, theirs)), role
    assert not any(p.requires_grad for p in adapter_parameters(loaded, "verifier"))
    assert all(p.requires_grad for p in adapter_parameters(loaded, "solver"))
    assert {id(p) for p in loaded.parameters() if p.requires_grad} == \
        {id(p) for p in role_parameters(loaded)["solver"]}
    ids = tokens(model)
    for role in ROLES:
        with acting(model, role), acting(loaded, role):
            assert torch.equal(logits(model, ids), logits(loaded, ids)), role

    # a subset, onto a base model given by hand, unfrozen this time
    one = load_roles(load_model(str(tiny_model_dir)), out, roles=["verifier"], frozen=[])
    assert roles_of(one).names == ("verifier",) and list(role_parameters(one)) == ["verifier"]
    assert all(torch.equal(a, b) for a, b in zip(adapter_parameters(one, "verifier"),
                                                  adapter_parameters(model, "verifier")))


def bad_roles(roles, frozen=()):
    return lambda model_dir: with_roles(load_model(str(model_dir)), roles, LORA, frozen=frozen)


def unknown_role(model_dir):
    with acting(two_roles(model_dir), "critic"):
        pass


@pytest.mark.parametrize("make, match", [
    (unknown_role, r"unknown role 'critic'.*\['solver', 'verifier'\]"),
    (bad_roles(["solver", "verifier", "solver"]), r"\['solver'\] named more than once"),
    (bad_roles([]), "at least one role"),
    (bad_roles(["solver", ""]), "role '': a role name is"),
    (bad_roles(["solver", "my verifier"]), "role 'my verifier'"),
    (bad_roles("solver"), "lists of names"),
    (bad_roles(ROLES, frozen=["critic"]), r"frozen roles \['critic'\] are not among the roles"),
    (bad_roles(["solver", "mlp"]), "'mlp': the name of a module of the model"),
    (bad_roles(["default"]), "'default': a name PEFT uses"),
    (bad_roles(["lora"]), "'lora': a name in PEFT's prefix"),
    (lambda d: with_roles(load_model(str(d)), ROLES, LoraConfig(rank=0)), r"lora\.rank=0"),
    (lambda d: with_roles(add_lora(load_model(str(d)), LORA), ROLES, LORA), "already has PEFT adapters"),
    (lambda d: with_roles(load_model(str(d)), ROLES, LoraConfig(rank=4, target_modules=("no_proj",))),
     r"lora\.target_modules"),
])
def test_bad_roles_are_refused_with_the_reason(tiny_model_dir, make, match):
    with pytest.raises(ValueError, match=match):
        make(tiny_model_dir)


def test_loading_a_role_that_was_not_saved_names_the_saved_ones(tiny_model_dir, tmp_path):
    out = save_roles(two_roles(tiny_model_dir), tmp_path / "roles")
    with pytest.raises(ValueError, match=r"role 'critic': no adapter at .*\['solver', 'verifier'\]"):
        load_roles(load_model(str(tiny_model_dir)), out, roles=["solver", "critic"])
