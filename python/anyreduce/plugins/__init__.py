"""Plugins that put anyreduce into unmodified vLLM and SGLang servers.

The wheel registers two entry points; each server loads its own in every process it starts:

* ``vllm.general_plugins``  -> ``anyreduce.plugins.vllm:register``
* ``sglang.srt.plugins``    -> ``anyreduce.plugins.sglang:register``

Both do nothing unless the environment variable ``ANYREDUCE`` is ``1`` (``true``, ``yes``,
``on``); ``0`` or unset leaves the server untouched, and any other value is refused with
ValueError. When on, each checks that libanyreduce loads (LibraryNotFoundError otherwise,
listing the places searched), installs its replacements and logs one line per replacement
through the server's own logger. A plugin never catches an error: a name it hooks that moved
upstream raises, naming it (what the server's loader then does with it is the server's policy;
docs/INTEGRATION.md says what each does).

This package imports neither torch nor the servers: the plugin modules import them inside
the functions that need them, so their registration, their classes' shapes and their tables of
hooked names (``HOOKS``) can be inspected and tested anywhere.
"""

from __future__ import annotations

import inspect
import os
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

__all__ = ["ENV_VAR", "Hooked", "enabled", "require_library", "signature_mismatch"]

ENV_VAR = "ANYREDUCE"

_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"", "0", "false", "no", "off"})


def enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether ``ANYREDUCE`` asks for the plugins. Unset, ``0``, ``false``, ``no``, ``off``: no;
    ``1``, ``true``, ``yes``, ``on``: yes (case-insensitive). Anything else is a typo that would
    otherwise silently leave anyreduce off: ValueError naming the value."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_VAR)
    if raw is None:
        return False
    value = raw.strip().lower()
    if value in _ON:
        return True
    if value in _OFF:
        return False
    raise ValueError(f"{ENV_VAR}={raw!r} is not understood: set {ENV_VAR}=1 to put anyreduce "
                     f"into the server, or {ENV_VAR}=0 (or leave it unset) to leave it out")


def require_library() -> str:
    """Load libanyreduce now and return its path: with ``ANYREDUCE=1`` a missing library is a
    configuration error, reported when the server starts (LibraryNotFoundError lists every place
    searched) rather than as a communicator that quietly stays disabled."""
    from .._library import library

    return library().path


class Hooked(NamedTuple):
    """One upstream name a plugin relies on, for the contract tests.

    ``module`` and ``name`` (dotted inside the module, e.g. ``"CustomAllreduce.capture"``) locate
    it. ``params``: the leading parameter names its signature must have, in order (``self``
    left out); ``None`` when only its existence matters. ``required``: False for names that only
    some versions or configurations have (an older dispatch function, an op defined only with
    FlashInfer installed); the plugin checks those at run time before using them."""

    module: str
    name: str
    params: Optional[Tuple[str, ...]]
    required: bool = True
    why: str = ""


def signature_mismatch(fn: Callable, expected: Sequence[str]) -> Optional[str]:
    """None when ``fn``'s parameters start with ``expected`` (``self``/``cls`` skipped), else a
    sentence saying what differs."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        return f"its signature cannot be read ({e})"
    names = [p.name for p in sig.parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    if tuple(names[:len(expected)]) != tuple(expected):
        return (f"expected parameters ({', '.join(expected)}), found "
                f"({', '.join(names)})")
    return None
