"""Where vLLM or SGLang is installed: every upstream name the anyreduce plugins hook exists
with the parameters the plugins were written against (the ``HOOKS`` tables), and the plugin
classes cover the upstream interfaces. An upstream rename fails here, loudly, instead of in a
server. Each table entry is its own test; without the server they skip, saying so."""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import pkgutil

import pytest

import anyreduce.plugins as plugins
from anyreduce.plugins import sglang as sglang_plugin
from anyreduce.plugins import vllm as vllm_plugin


def _need(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed: its hooked names cannot be checked here")


def _resolve(hooked: plugins.Hooked):
    """The hooked object, or a skip for an optional name this installation does not have."""
    try:
        module = importlib.import_module(hooked.module)
    except Exception as e:  # noqa: BLE001 -- reported below, as a failure or a skip
        if hooked.required:
            pytest.fail(f"{hooked.module} does not import: {type(e).__name__}: {e}")
        pytest.skip(f"{hooked.module} does not import here ({type(e).__name__}: {e}); "
                    f"optional: {hooked.why}")
    try:
        return pkgutil.resolve_name(f"{module.__name__}:{hooked.name}")
    except AttributeError:
        if hooked.required:
            pytest.fail(f"{hooked.module}.{hooked.name} is gone ({hooked.why or 'hooked'})")
        pytest.skip(f"{hooked.module}.{hooked.name} is absent in this version; optional: "
                    f"{hooked.why}")


def _check(hooked: plugins.Hooked) -> None:
    obj = _resolve(hooked)
    if hooked.params is not None:
        problem = plugins.signature_mismatch(obj, hooked.params)
        assert problem is None, f"{hooked.module}.{hooked.name}: {problem}"


@pytest.mark.parametrize("hooked", vllm_plugin.HOOKS, ids=lambda h: f"{h.module}.{h.name}")
def test_vllm_hooked_name(hooked):
    _need("vllm")
    _check(hooked)


@pytest.mark.parametrize("hooked", sglang_plugin.HOOKS, ids=lambda h: f"{h.module}.{h.name}")
def test_sglang_hooked_name(hooked):
    _need("sglang")
    _check(hooked)


def test_vllm_class_accepts_upstreams_constructor_and_methods():
    _need("vllm")
    upstream = importlib.import_module(vllm_plugin.CAR_MODULE).CustomAllreduce
    if upstream is vllm_plugin.CustomAllreduce:  # the plugin ran in this process
        pytest.skip("the plugin already replaced the class in this process")
    ours = vllm_plugin.CustomAllreduce
    theirs = [p.name for p in inspect.signature(upstream.__init__).parameters.values()
              if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    assert plugins.signature_mismatch(ours.__init__, theirs) is None
    for name in ("should_custom_ar", "custom_all_reduce", "all_reduce", "capture", "close",
                 "finalize_p2p", "register_graph_buffers"):
        method = getattr(upstream, name, None)
        if method is None:
            continue
        expected = [p for p in inspect.signature(method).parameters if p != "self"]
        assert plugins.signature_mismatch(getattr(ours, name), expected) is None, name


def test_sglang_communicator_covers_the_base_interface():
    _need("sglang")
    try:
        base = importlib.import_module(sglang_plugin.BASE_MODULE)
    except ModuleNotFoundError:
        pytest.skip("this SGLang has no BaseCommunicator (the older interface is used)")
    helpers = {"validate", "allocate_all_gather", "allocate_reduce_scatter", "assert_inplace",
               "assert_outplace"}
    public = [n for n, m in vars(base.BaseCommunicator).items()
              if not n.startswith("_") and n not in helpers
              and (callable(m) or isinstance(m, (property, staticmethod, classmethod)))]
    missing = [n for n in public if n not in vars(sglang_plugin.Communicator)]
    assert not missing, f"BaseCommunicator has methods the anyreduce communicator lacks: {missing}"
    assert {m.value for m in base.AllReduceMode} >= {"both", "inplace", "outplace"}
