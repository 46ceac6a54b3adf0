"""The type stubs (`_native.pyi`) say what the Rust extension module has: every public
method of `Client` is in them, with the parameters (names, order, which have defaults)
the module's own signatures give."""

import ast
import inspect
import pathlib

from shardcache import _native

STUBS = pathlib.Path(_native.__file__).parent / "_native.pyi"


def stub_methods():
    tree = ast.parse(STUBS.read_text())
    client = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Client")
    methods = {}
    for node in client.body:
        if isinstance(node, ast.FunctionDef) and not any(
            isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
        ):
            args = node.args.args[1:]  # without self
            defaults = len(node.args.defaults)
            methods[node.name] = [(a.arg, i >= len(args) - defaults) for i, a in enumerate(args)]
    return methods


def module_signature(name):
    target = _native.Client if name == "__init__" else getattr(_native.Client, name)
    params = list(inspect.signature(target).parameters.values())
    if params and params[0].name in ("self", "$self"):
        params = params[1:]
    return [(p.name, p.default is not inspect.Parameter.empty) for p in params]


def test_the_stubs_match_the_module():
    stubs = stub_methods()
    public = {n for n in dir(_native.Client) if not n.startswith("__") and callable(getattr(_native.Client, n))}
    missing = sorted(public - set(stubs))
    assert not missing, f"methods of the module missing from {STUBS.name}: {missing}"
    for name, params in stubs.items():
        assert module_signature(name) == params, f"{name}: stub {params} != module {module_signature(name)}"


def test_every_class_of_the_module_has_a_stub():
    tree = ast.parse(STUBS.read_text())
    stubbed = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    classes = {n for n in dir(_native) if not n.startswith("_") and isinstance(getattr(_native, n), type)}
    assert classes <= stubbed, f"classes without a stub: {sorted(classes - stubbed)}"
