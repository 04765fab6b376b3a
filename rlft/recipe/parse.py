"""Parsing: YAML recipe + dotted overrides -> the frozen, checked :class:`~rlft.config.sections.Config`.

Values are type-checked against the field annotations and only lossless
conversions happen (int -> float, list -> tuple, '1e-5' -> 1e-5); presets are
applied to the algo section before it is built, and the built tree goes through
:func:`rlft.recipe.validate.validate` (the rules that need the registries).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import types
import typing
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal, Mapping

import yaml

from rlft.config.algo import AlgoConfig
from rlft.config.checks import ConfigError, _check
from rlft.config.env import FIELDS as ENV_FIELDS
from rlft.config.env import EnvConfig
from rlft.config.sections import Config
from rlft.config.insight import EvalSet
from rlft.config.reward import RewardTerm, WeightSchedule
from rlft.envs.build import check_params
from rlft.errors import utf8_text
from rlft.recipe.presets import PRESETS, conflict
from rlft.recipe.validate import validate
from rlft.rewards import REWARDS


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp``; convert only lossless cases (int -> float, list -> tuple)."""
    if tp is RewardTerm:
        return _reward_term(value, key)
    if dataclasses.is_dataclass(tp):  # an entry of a list of sections (eval.sets)
        if tp is EvalSet and isinstance(value, str):  # a bare source
            value = {"source": value}
        return _build(tp, value, f"{key}.", entry=True)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType) and type(None) in typing.get_args(tp):  # X | None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if value is None else _coerce(value, inner, key)
    if origin is Literal:
        allowed = typing.get_args(tp)
        yaml_bool = isinstance(value, bool) and not any(isinstance(a, bool) for a in allowed)
        _check(value in allowed and not yaml_bool, key, f"must be one of {', '.join(map(str, allowed))}, got {value!r}"
               + (" (YAML reads yes/no/on/off as true/false: quote it, 'off')" if yaml_bool else ""))
        return value
    if origin is tuple:
        (elem, _ellipsis) = typing.get_args(tp)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        _check(isinstance(value, (list, tuple)), key, f"must be a list, got {value!r}")
        return tuple(_coerce(v, elem, f"{key}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        _check(isinstance(value, bool), key, f"must be true or false, got {value!r}")
        return value
    if tp is int:
        _check(isinstance(value, int) and not isinstance(value, bool), key, f"must be an integer, got {_shown(value)}")
        _check(abs(value) < 2**63, key, f"must be an integer below 2**63 in size, got {_shown(value)}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads '1e-5' (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                pass
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        _check(ok, key, f"must be a number, got {_shown(value)}")
        try:
            number = float(value)
        except OverflowError:  # an integer beyond float's range
            number = math.inf
        _check(math.isfinite(number), key, f"must be a finite number, got {_shown(value)}")
        return number
    if tp is str:
        _check(isinstance(value, str), key, f"must be a string, got {value!r}"
               + (" (YAML reads yes/no/on/off as true/false: quote it, 'yes')" if isinstance(value, bool) else ""))
        return value
    raise TypeError(f"{key}: unsupported annotation {tp!r}")  # a bug in this file, not user input


def _shown(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters (a value pasted by mistake can be megabytes, an int too long
    to print)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**60:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit - 3]}..."


def _term_mapping(value: Any) -> Any:
    """A reward entry written on the command line as a flow mapping (``label.judge={name: judge, path: d}``) comes
    from parse_override as text, which keeps mappings as text for prompt templates: read it back as the mapping it
    is. A reward's name never starts with ``{``; anything else is returned as it came."""
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            parsed = _yaml(value)
        except (yaml.YAMLError, ValueError, RecursionError):
            return value
        if isinstance(parsed, Mapping):
            return parsed
    return value


def _reward_term(value: Any, key: str) -> RewardTerm:
    """``math`` or ``{name: partial_credit, weight: 1, tolerance: 1}`` -> a RewardTerm with type-checked parameters;
    ``schedule`` (a mapping of :class:`WeightSchedule`'s fields) makes its weight follow the RL step."""
    if isinstance(value, RewardTerm):
        return value
    value = _term_mapping(value)
    if isinstance(value, str):
        value = {"name": value}
    _check(isinstance(value, Mapping), key, f"must be a reward name or a mapping with 'name', got {value!r}")
    _check(isinstance(value.get("name"), str), f"{key}.name", "missing; every entry needs the reward's name")
    name = value["name"]
    _check(name in REWARDS, f"{key}.name", f"unknown reward {name!r}; allowed: {', '.join(REWARDS.names())}")
    allowed = REWARDS.parameters(name)
    params = []
    for k, v in value.items():
        if k in TERM_KEYS:
            continue
        _check(k in allowed, f"{key}.{k}", f"unknown parameter of reward {name!r}; allowed: "
               f"{', '.join([*TERM_KEYS[1:3], *allowed, *TERM_KEYS[3:]])}")
        params.append((k, _coerce(v, allowed[k][0], f"{key}.{k}")))
    weight = value.get("weight")
    label = value.get("label", "")
    schedule = value.get("schedule")
    if schedule is not None and not isinstance(schedule, WeightSchedule):
        schedule = _build(WeightSchedule, schedule, f"{key}.schedule.", entry=True)
    try:
        return RewardTerm(name=name, weight=None if weight is None else _coerce(weight, float, f"{key}.weight"),
                          label=_coerce(label, str, f"{key}.label"), params=tuple(params),
                          schedule=schedule or WeightSchedule())
    except ConfigError as e:
        raise ConfigError(f"{key}.{e}") from None


TERM_KEYS = ("name", "weight", "label", "schedule")
"""The keys of a reward.fns entry that are not the reward's own parameters."""


KEY_ALIASES: dict[str, dict[str, str]] = {"train": {"async": "async_rollout"}}
"""Keys read under another name, by section: a field cannot be called ``async`` (a Python keyword), so ``train.async``
is the field ``train.async_rollout``. A recipe's section is read with its aliases renamed (both names in one
section: an error naming them); an override names either, and the later override wins."""


def _unalias(tree: dict) -> None:
    """Rename the aliased keys of ``tree``'s sections (a recipe) to their fields' names, in place."""
    for section, aliases in KEY_ALIASES.items():
        data = tree.get(section)
        if not isinstance(data, dict):
            continue
        for alias, name in aliases.items():
            if alias in data:
                _check(name not in data, f"{section}.{alias}",
                       f"is {section}.{name} under another name; give one of them")
                data[name] = data.pop(alias)


def _build(cls: type, data: Mapping[str, Any], prefix: str, entry: bool = False) -> Any:
    """The dataclass ``cls`` from ``data``; an ``entry`` of a list checks its fields under bare names, which get
    ``prefix`` (``eval.sets[1].``) here."""
    _check(isinstance(data, Mapping), prefix.rstrip(".") or "config", f"must be a section (a mapping), got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    for key in data:
        _check(key in known, f"{prefix}{key}", f"unknown key; allowed: {', '.join(sorted(known))}")
    kwargs = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if tp is EnvConfig:
            kwargs[f.name] = _env_section({} if data[f.name] is None else data[f.name])
        elif tp is RewardTerm:  # one reward entry (label.judge); a mapping without a name keeps the default's
            value = _term_mapping(data[f.name])
            if isinstance(value, Mapping) and "name" not in value:
                value = {"name": f.default.name, **value}
            kwargs[f.name] = _coerce(value, tp, key)
        elif dataclasses.is_dataclass(tp):  # an empty section (`model:` in YAML) is null
            kwargs[f.name] = _build(tp, {} if data[f.name] is None else data[f.name], f"{key}.")
        else:
            kwargs[f.name] = _coerce(data[f.name], tp, key)
    try:
        return cls(**kwargs)
    except ConfigError as e:
        if not entry:
            raise
        raise ConfigError(f"{prefix}{e}") from None


def _env_section(data: Any) -> EnvConfig:
    """``{name: tools, max_turns: 4, tools: [calculator]}`` -> an EnvConfig whose ``params`` hold every key that is
    not one of the loop's, checked against the environment (its signature, then one environment built)."""
    if isinstance(data, EnvConfig):
        return data
    _check(isinstance(data, Mapping), "env", f"must be a section (a mapping), got {_shown(data)}")
    own = {k: v for k, v in data.items() if k in ENV_FIELDS}
    params = {k: v for k, v in data.items() if k not in ENV_FIELDS}
    cfg = _build(EnvConfig, own, "env.")
    if cfg.name:
        try:
            check_params(cfg.name, cfg.fn, params)
        except ConfigError:
            raise
        except (ValueError, TypeError) as e:
            raise ConfigError(f"env.{e}") from None
    _check(bool(cfg.name) or not params, "env", f"parameters {sorted(params)} given, but no env.name (env=null "
           "drops the whole section)")
    return dataclasses.replace(cfg, params=tuple(params.items()))


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error (where PyYAML keeps the last
    value silently: a recipe that sets ``lr`` twice would run with whichever came last)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key is the base loader's error
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark,
                    f"found key {key!r} again (first at line {seen[key] + 1}); a key may appear once",
                    key_node.start_mark)
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _yaml(text: str) -> Any:
    return yaml.load(text, Loader=_UniqueKeys)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'algo.group_size=4'`` -> (['algo', 'group_size'], 4). Values are read as YAML scalars/lists."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected key=value, e.g. algo.group_size=4")
    key, raw = text.split("=", 1)
    parts = key.strip().split(".")
    if not all(parts):
        raise ConfigError(f"override {text!r}: malformed key {key!r}")
    try:
        value = _yaml(raw) if raw.strip() else ""
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: an int too long to read; RecursionError: [[[...
        value = raw  # not YAML (e.g. 'Question: {prompt} Answer:'): plain text, type-checked like any value
    if isinstance(value, dict):  # 'Q: {prompt}' reads as a YAML mapping; on the command line it is text
        value = raw
    return parts, value


def _set(tree: dict, parts: list[str], value: Any, text: str) -> None:
    node = tree
    for p in parts[:-1]:
        child = node.setdefault(p, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {text!r}: {p} is not a section")
        node = child
    node[parts[-1]] = value


def load_config(recipe: str | Path | Mapping | None = None,
                overrides: Mapping[str, Any] | list[str | Mapping] | tuple[str, ...] | None = ()) -> Config:
    """``recipe`` (a YAML file, or a mapping holding the same tree) with ``overrides`` on top: ``key=value`` texts
    (the command line's, values read as YAML) or a mapping of dotted keys (``{"train.steps": 20}``) and sections
    (``{"train": {"steps": 20}}``) to values, taken as they are; the checked, frozen configuration."""
    if isinstance(recipe, Mapping):
        _check(all(isinstance(k, str) for k in recipe), "recipe", "a mapping's keys must be section names")
        tree: dict[str, Any] = copy.deepcopy(dict(recipe))
    else:
        tree = _read_recipe(recipe) if recipe is not None else {}
    _unalias(tree)
    if isinstance(tree.get("algo"), str):  # recipe shorthand `algo: dapo`
        tree["algo"] = {"preset": tree["algo"]}
    for parts, value, text in _override_items(overrides or ()):
        if parts == ["algo"] and isinstance(value, str):  # `algo=dapo` selects a preset, keeping other algo keys
            parts = ["algo", "preset"]
        if len(parts) == 2 and parts[1] in KEY_ALIASES.get(parts[0], {}):
            parts = [parts[0], KEY_ALIASES[parts[0]][parts[1]]]
        _set(tree, parts, value, text)
    required = _required(tree.pop(REQUIRED, []))
    _preset_from_stages(tree)
    reward = tree.get("reward")
    if isinstance(reward, dict) and "fns" in reward and "weights" not in reward:
        reward["weights"] = []  # the default weights belong to the default fns: each new entry's own, else 1.0
    try:
        if "algo" in tree:
            tree["algo"] = _apply_preset(tree["algo"])
        cfg = _build(Config, tree, "")
        _check_required(cfg, required, "given as a mapping" if isinstance(recipe, Mapping) else recipe)
        return validate(cfg)
    except ConfigError:
        raise
    except (KeyError, ValueError) as e:  # registry lookups and range checks inside sections
        raise ConfigError(str(e)) from None


def _read_recipe(recipe: str | Path) -> dict[str, Any]:
    path = Path(recipe)
    if not path.is_file():
        raise ConfigError(f"recipe {str(path)!r} " + ("is a directory, not a YAML file" if path.is_dir()
                                                     else "does not exist"))
    text = utf8_text(path.read_bytes(), f"recipe {path}", ConfigError)
    try:
        tree = _yaml(text) or {}
    except (yaml.YAMLError, ValueError, RecursionError) as e:  # ValueError: an int too long to read
        raise ConfigError(f"recipe {path}: invalid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"recipe {path}: top level must be a mapping of sections")
    return tree


def _override_items(overrides: Mapping[str, Any] | list[str] | tuple[str, ...]):
    """(key parts, value, how it was written) of each override: ``key=value`` texts, or a mapping whose nested
    mappings are sections (flattened to dotted keys), or a list of both."""
    if not isinstance(overrides, Mapping):
        if isinstance(overrides, str):
            raise ConfigError(f"overrides: expected a list of key=value texts or a mapping, got the text "
                              f"{_shown(overrides)}")
        for text in overrides:  # texts, or mappings among them (applied in order)
            _check(isinstance(text, (str, Mapping)), "overrides", f"expected key=value texts, got {_shown(text)}")
            yield from _override_items(text) if isinstance(text, Mapping) else [(*parse_override(text), text)]
        return
    for key, value in overrides.items():
        _check(isinstance(key, str) and all(key.split(".")), "overrides", f"malformed key {_shown(key)}")
        if isinstance(value, Mapping) and value:
            for parts, inner, _ in _override_items({f"{key}.{k}": v for k, v in value.items()}):
                yield parts, inner, f"{'.'.join(parts)}={_shown(inner)}"
        else:
            yield key.split("."), value, f"{key}={_shown(value)}"


REQUIRED = "required"
"""A recipe's top-level list of the keys it needs a value for (``required: [model.path]``): each must be set to
something not empty, in the recipe or on the command line, or the recipe stops at parse time naming the key.
An override ``required=[]`` lifts it."""


def _required(keys: Any) -> tuple[str, ...]:
    if isinstance(keys, str):
        keys = [keys]
    _check(isinstance(keys, (list, tuple)) and all(isinstance(k, str) for k in keys), REQUIRED,
           f"must be a list of keys such as [model.path], got {_shown(keys)}")
    return tuple(keys)


def _check_required(cfg: Config, keys: tuple[str, ...], recipe) -> None:
    """Each of ``keys`` (dotted) names a field of ``cfg`` whose value is not empty ("", an empty list)."""
    for key in keys:
        node: Any = cfg
        for part in key.split("."):
            _check(dataclasses.is_dataclass(node) and part in {f.name for f in fields(node)}, f"{REQUIRED}",
                   f"{key!r} is not a configuration key")
            node = getattr(node, part)
        _check(node not in ("", (), None), key, "is required by "
               + (f"the recipe {recipe}" if recipe is not None else "this configuration")
               + f" and is empty; give it, e.g. {key}=<value>")


def _preset_from_stages(tree: dict) -> None:
    """A preset named in ``stages`` (``[sft, grpo]``) selects ``algo.preset``; a different explicit one is an error."""
    stages = tree.get("stages")
    named = [s for s in stages if isinstance(s, str) and s in PRESETS] if isinstance(stages, (list, tuple)) else []
    if not named:
        return
    algo = tree.get("algo") if isinstance(tree.get("algo"), dict) else {}
    _check(algo.get("preset", named[0]) == named[0], "algo.preset",
           f"{algo.get('preset')!r} conflicts with the stage {named[0]!r} in `stages`; name the algorithm once")
    tree["algo"] = {**algo, "preset": named[0]}


def _apply_preset(section: Any) -> Any:
    """``{preset: dapo, clip_high: 0.3}`` -> the preset's fields with the explicit keys on top.

    An explicit key that contradicts a field defining the preset is an error; the
    ``preset`` key itself is consumed (the saved config holds the resolved fields).
    """
    if not isinstance(section, Mapping) or "preset" not in section:
        return section
    name = section["preset"]
    _check(isinstance(name, str) and name in PRESETS, "algo.preset",
           f"unknown preset {name!r}; allowed: {', '.join(PRESETS.names())}")
    explicit = {k: v for k, v in section.items() if k != "preset"}
    hints = typing.get_type_hints(AlgoConfig)
    for key, value in explicit.items():
        if key in hints:  # an unknown key is refused by _build, with the allowed keys
            value = _coerce(value, hints[key], f"algo.{key}")
            why = conflict(name, key, value)
            _check(why is None, f"algo.{key}",
                   f"{value!r} conflicts with preset {name}, {why}; drop the preset or the override")
    return {**PRESETS.get(name)(), **explicit}
