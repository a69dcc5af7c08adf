"""ONNX import: an ONNX model becomes a symfuse graph with the same symbolic shapes as capture.

Each input dim with a `dim_param` becomes the symfuse symbol of that name (the same name on
two inputs is one symbol), a `dim_value` stays static, and a dim with neither gets a symbol
`<input>_<dim>`. Initializers and `Constant`s are known values; nodes whose inputs are all
known are folded at import. The chains exporters write to compute shapes at run time
(`Shape -> Gather -> Unsqueeze -> Concat -> Reshape`) fold too: a known value may hold
symbolic dims (a numpy array of dim expressions), so `Reshape`, `Expand`, `Slice`,
`Range` and `ConstantOfShape` see sizes like `S` or `B*S` and never become data.
Every other node converts through `ONNX_OPS` (`onnx_table.py`) into registry ops, whose
shape rules put the facts each op implies into the store, as for a torch capture.

Parsing, checking, opset conversion and function inlining use the `onnx` package.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import time
from typing import Any

import numpy as np
import onnx
import torch.utils._pytree as pytree
from onnx import numpy_helper

from symfuse.errors import UnsupportedOpsError
from symfuse.frontend.aten_table import Unsupported
from symfuse.frontend.dynamic import DimDecl, _decl
from symfuse.frontend.onnx_table import (
    FOLD,
    ONNX_OPS,
    SEQUENCE_OPS,
    OnnxNode,
    Sequence,
    np_dtype_to_symfuse,
    onnx_dtype,
    to_torch,
)
from symfuse.frontend.torch_export import Captured
from symfuse.ir.dims import Dim, dim
from symfuse.ir.dtypes import DType
from symfuse.ir.graph import Value
from symfuse.shape.infer import GraphBuilder
from symfuse.shape.store import ShapeStore

log = logging.getLogger("symfuse")

MIN_OPSET = 13
_STD_DOMAINS = ("", "ai.onnx")


def load_model(model: Any) -> onnx.ModelProto:
    """The model as a checked ModelProto at opset 13 or newer, with local functions inlined."""
    if isinstance(model, onnx.ModelProto):
        proto = model
    else:
        path = os.fspath(model)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"ONNX model '{path}' does not exist")
        try:
            proto = onnx.load(path)
        except Exception as e:  # noqa: BLE001  (protobuf raises several types)
            raise ValueError(f"'{path}' is not a readable ONNX model: {e}") from None
    if proto.ir_version < 4:
        proto = _initializers_as_inputs(proto)
    opset = next((o.version for o in proto.opset_import if o.domain in _STD_DOMAINS), None)
    if opset is None:
        raise ValueError("the ONNX model imports no version of the standard ONNX operator set")
    if opset < 7:
        proto = _channel_slopes(proto)
    if opset < MIN_OPSET:
        try:
            proto = onnx.version_converter.convert_version(proto, MIN_OPSET)
        except Exception as e:  # noqa: BLE001
            raise ValueError(
                f"the ONNX model uses opset {opset}; symfuse reads opset {MIN_OPSET} and newer, and converting it "
                f"failed: {e}"
            ) from None
    if proto.ir_version < 4:  # again: the conversion adds initializers of its own
        proto = _initializers_as_inputs(proto)
    if proto.functions:
        proto = onnx.inliner.inline_local_functions(proto)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise ValueError(f"the ONNX model is not valid: {first}") from None
    except ValueError:
        pass  # over 2 GB: the checker needs a path; the import below checks what it uses
    return proto


def _initializers_as_inputs(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Before IR version 4 every initializer had to be a graph input too; exporters of that
    time did not always list them (ONNX Runtime accepts such files). A copy that lists them."""
    listed = {i.name for i in proto.graph.input}
    missing = [t for t in proto.graph.initializer if t.name not in listed]
    if not missing:
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    for t in missing:
        out.graph.input.append(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def _channel_slopes(proto: onnx.ModelProto) -> onnx.ModelProto:
    """Before opset 7 a 1-D `PRelu` slope of C values applied along the channels (dim 1);
    from opset 7 it broadcasts from the right like any operand, which the version converter
    leaves to the model. A copy whose constant slopes are shaped [C, 1, ..., 1]."""
    prelus = [n for n in proto.graph.node if n.op_type == "PRelu" and n.domain in _STD_DOMAINS]
    inits = {t.name: t for t in proto.graph.initializer}
    if not any(len(n.input) > 1 and n.input[1] in inits for n in prelus):
        return proto
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    inits = {t.name: t for t in out.graph.initializer}
    typed = onnx.shape_inference.infer_shapes(out).graph
    ranks = {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in (*typed.input, *typed.value_info, *typed.output)
        if vi.type.tensor_type.HasField("shape")
    }
    for n in prelus:
        slope, rank = inits.get(n.input[1]), ranks.get(n.input[0], 0)
        if slope is not None and len(slope.dims) == 1 and slope.dims[0] > 1 and rank > 2:
            slope.dims[:] = [slope.dims[0]] + [1] * (rank - 2)
            for vi in out.graph.input:
                if vi.name == slope.name:
                    vi.CopyFrom(onnx.helper.make_tensor_value_info(slope.name, slope.data_type, list(slope.dims)))
    return out


def check_supported(graph: onnx.GraphProto) -> None:
    """One error listing every op type symfuse cannot import, with its count and nodes."""
    bad: dict[str, list[str]] = collections.defaultdict(list)
    for i, n in enumerate(graph.node):
        key = n.op_type if n.domain in _STD_DOMAINS else f"{n.domain}.{n.op_type}"
        if n.domain not in _STD_DOMAINS or (n.op_type not in ONNX_OPS and n.op_type not in FOLD):
            bad[key].append(n.name or f"#{i}")
    if bad:
        problems = [
            (op, f"{len(names)} node(s), no symfuse mapping", ", ".join(names[:5]) + (" ..." if len(names) > 5 else ""))
            for op, names in sorted(bad.items())
        ]
        raise UnsupportedOpsError(problems)


def _symbol_name(name: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", name)
    return s if s and not s[0].isdigit() else f"d_{s}"


def _input_decls(graph_inputs, dynamic: Any) -> dict[str, dict[int, DimDecl]]:
    """Each input dim's symbol (None: static), from the model's dim_params and `dynamic`."""
    names = [i.name for i in graph_inputs]
    if isinstance(dynamic, (tuple, list)):
        dynamic = dict(zip(names, dynamic))
    dynamic = dynamic or {}
    if not isinstance(dynamic, dict):
        raise TypeError("dynamic must be a dict {input name: {dim: name}}, a tuple of such dicts, or None")
    for k in dynamic:
        if k not in names:
            raise ValueError(f"dynamic names input '{k}', but the ONNX model's inputs are {', '.join(names)}")
    out: dict[str, dict[int, DimDecl]] = {}
    for i in graph_inputs:
        if not i.type.HasField("tensor_type"):
            kind = (i.type.WhichOneof("value") or "value").replace("_type", "")
            raise ValueError(f"ONNX input '{i.name}' is a {kind}; symfuse takes tensor inputs")
        dims = i.type.tensor_type.shape.dim if i.type.tensor_type.HasField("shape") else None
        if dims is None:
            raise ValueError(f"ONNX input '{i.name}' has no shape; symfuse needs at least its rank")
        user = dynamic.get(i.name) or {}
        for d in user:
            if not isinstance(d, int) or not -len(dims) <= d < len(dims):
                raise ValueError(f"dynamic['{i.name}'] names dim {d}, but input '{i.name}' has rank {len(dims)}")
        user = {d % len(dims): spec for d, spec in user.items()}
        decls: dict[int, DimDecl] = {}
        for d, dd in enumerate(dims):
            if d in user:
                decl = _decl(user[d], i.name, d)
                if decl is None and not dd.HasField("dim_value"):
                    raise ValueError(
                        f"input '{i.name}' dim {d} is declared static, but the ONNX model gives it no size"
                    )
                if decl is not None:
                    decls[d] = decl
            elif dd.HasField("dim_value") and dd.dim_value > 0:
                continue
            elif dd.HasField("dim_param") and dd.dim_param:
                decls[d] = DimDecl(_symbol_name(dd.dim_param))
            else:
                decls[d] = DimDecl(_symbol_name(f"{i.name}_{d}"))
        out[i.name] = decls
    return out


class OnnxConverter:
    """The environment of an import: ONNX value names to symfuse values or known arrays."""

    def __init__(self, builder: GraphBuilder, opset: int, consumers: dict[str, list[onnx.NodeProto]]) -> None:
        self.b = builder
        self.store = builder.store
        self.opset = opset
        self.consumers = consumers
        self.env: dict[str, Any] = {}  # name -> Value | np.ndarray (object arrays hold dims)
        self._const: dict[int, tuple[np.ndarray, Value]] = {}  # by id; the array is kept alive
        self.initializer_names: dict[int, str] = {}
        self.input_names: dict[Value, str] = {}  # graph inputs, by the model's names
        self.loc = ""
        self.name = ""

    # -- values -----------------------------------------------------------------------
    def emit(self, op: str, inputs, **attrs) -> Value:
        return self.b.add(op, inputs, attrs, loc=self.loc, name=self.name)[0]

    def emit_multi(self, op: str, inputs, **attrs) -> tuple[Value, ...]:
        return self.b.add(op, inputs, attrs, loc=self.loc, name=self.name)

    def tensor(self, v: Any) -> Value:
        """A symfuse value for `v`, making a known array a constant (or a 0-d scalar)."""
        if isinstance(v, Value):
            return v
        if not isinstance(v, np.ndarray):
            raise Unsupported(f"expected a tensor, got {v!r}")
        if v.dtype == object:
            flat = [self.store.canon(dim(x)) for x in v.reshape(-1)]
            if all(x.is_Integer for x in flat):
                return self.tensor(np.array([int(x) for x in flat], dtype=np.int64).reshape(v.shape))
            parts = [self.emit("reshape", [self.b.scalar(x, DType.int64, loc=self.loc)], shape=(dim(1),)) for x in flat]
            out = parts[0] if len(parts) == 1 else self.emit("cat", parts, dim=0)
            return self.emit("reshape", [out], shape=tuple(dim(s) for s in v.shape))
        if id(v) not in self._const:
            if v.ndim == 0:
                made = self.b.scalar(v.item(), np_dtype_to_symfuse(v.dtype), loc=self.loc)
            else:
                name = self.initializer_names.get(id(v)) or self.name or "const"
                made = self.b.constant(_symbol_name(name), to_torch(v))
            self._const[id(v)] = (v, made)
        return self._const[id(v)][1]

    def known(self, v: Any, what: str) -> np.ndarray:
        if isinstance(v, np.ndarray):
            return v
        inputs = self.inputs_behind(v) if isinstance(v, Value) else []
        source = ", ".join(f"'{self.input_names.get(i, i.name)}'" for i in inputs) or "input data"
        raise Unsupported(
            f"{what} must be known when the model is compiled (a constant, or computed from shapes), "
            f"but it is computed from the values of {source}"
            + (" (give it as an initializer, or compile with its value fixed)" if inputs else "")
        )

    def inputs_behind(self, v: Value) -> list[Value]:
        """The graph inputs whose values `v` is computed from."""
        producer = {o: n for n in self.b.graph.nodes for o in n.outputs}
        seen, todo, found = set(), [v], []
        while todo:
            u = todo.pop()
            if u in seen or u is None:
                continue
            seen.add(u)
            if u in self.input_names:
                found.append(u)
            elif u in producer:
                todo.extend(producer[u].inputs)
        return sorted(found, key=lambda i: self.input_names[i])

    def ints(self, v: Any, what: str) -> list:
        """A known 1-D (or 0-d) integer value as a list of ints and dim expressions."""
        arr = self.known(v, what)
        out = []
        for x in arr.reshape(-1).tolist():
            x = self.store.canon(dim(int(x) if isinstance(x, (int, np.integer)) else x))
            out.append(int(x) if x.is_Integer else x)
        return out

    def dims(self, v: Any, what: str) -> tuple[Dim, ...]:
        return tuple(dim(x) for x in self.ints(v, what))


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    out = {}
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, onnx.TensorProto):
            v = numpy_helper.to_array(v)
        elif isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def _fold_with_reference(node: onnx.NodeProto, inputs: list, opset: int) -> list[np.ndarray] | None:
    """Run one node whose inputs are all known numeric arrays through onnx's reference."""
    from onnx.reference import ReferenceEvaluator

    def numeric(x):
        if x is None or x.dtype != object:
            return x
        if all(isinstance(e, int) or (hasattr(e, "is_Integer") and e.is_Integer) for e in x.reshape(-1).tolist()):
            return x.astype(np.int64)
        return None

    converted = [numeric(x) for x in inputs]
    if any(c is None and x is not None for c, x in zip(converted, inputs)):
        return None  # symbolic dims: the table's converter makes them tensors
    inputs = converted
    try:
        names = [f"in{i}" for i in range(len(inputs))]
        n = onnx.helper.make_node(node.op_type, [nm if x is not None else "" for nm, x in zip(names, inputs)],
                                  list(node.output), domain=node.domain)  # fmt: skip
        n.attribute.extend(node.attribute)
        ins = [onnx.helper.make_tensor_value_info(nm, onnx.TensorProto.UNDEFINED, None) for nm, x in zip(names, inputs)
               if x is not None]  # fmt: skip
        outs = [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o]
        g = onnx.helper.make_graph([n], "fold", ins, outs)
        m = onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", opset)])
        got = ReferenceEvaluator(m).run(None, {nm: x for nm, x in zip(names, inputs) if x is not None})
    except Exception:  # noqa: BLE001  (the node converts as a tensor op instead)
        return None
    return [np.asarray(x) for x in got]


def capture_onnx(model: Any, dynamic: Any = None) -> Captured:
    t0 = time.perf_counter()
    proto = load_model(model)
    t1 = time.perf_counter()
    g = proto.graph
    check_supported(g)
    if g.sparse_initializer:
        raise UnsupportedOpsError([("sparse_initializer", "sparse initializers are not supported", "")])
    opset = max(o.version for o in proto.opset_import if o.domain in _STD_DOMAINS)
    name = _symbol_name(g.name or "onnx_model")
    store = ShapeStore()
    b = GraphBuilder(name, store)
    consumers: dict[str, list[onnx.NodeProto]] = collections.defaultdict(list)
    for n in g.node:
        for i in n.input:
            consumers[i].append(n)
    cx = OnnxConverter(b, opset, consumers)
    for init in g.initializer:
        cx.env[init.name] = numpy_helper.to_array(init)
        cx.initializer_names[id(cx.env[init.name])] = init.name
    graph_inputs = [i for i in g.input if i.name not in cx.env]
    decls = _input_decls(graph_inputs, dynamic)
    declared = []
    for i in graph_inputs:
        tt = i.type.tensor_type
        if not i.type.HasField("tensor_type"):
            raise ValueError(f"ONNX input '{i.name}' is not a tensor; symfuse takes tensor inputs")
        shape = []
        for d, dd in enumerate(tt.shape.dim):
            decl = decls[i.name].get(d)
            if decl is None:
                shape.append(dim(dd.dim_value))
            else:
                lo, hi = decl.lo, decl.hi
                shape.append(store.declare(decl.name, lo=lo, hi=hi, bound_at=f"input '{i.name}' dim {d}"))
        v = b.input(i.name, shape, onnx_dtype(tt.elem_type))
        cx.env[i.name] = v
        cx.input_names[v] = i.name
        declared.append(v)

    for idx, node in enumerate(g.node):
        cx.name = _symbol_name(node.output[0] if node.output and node.output[0] else node.op_type.lower())
        cx.loc = f"{node.op_type} node '{node.name or f'#{idx}'}'"
        if node.output and node.output[0] in cx.env:
            continue  # taken over by an earlier node's pattern (see onnx_table)
        ins = [cx.env[i] if i else None for i in node.input]
        missing = [i for i, v in zip(node.input, ins) if i and i not in cx.env]
        if missing:
            raise ValueError(f"{cx.loc} reads '{missing[0]}', which no earlier node or input defines")
        on = OnnxNode(node, ins, _attrs(node), opset)
        try:
            outs = None
            known = all(x is None or isinstance(x, np.ndarray) for x in ins)
            if known and node.op_type in FOLD:
                outs = FOLD[node.op_type](cx, on)
            if outs is None and known and node.op_type not in ("Constant", *SEQUENCE_OPS):
                outs = _fold_with_reference(node, ins, opset)
            if outs is None and node.op_type not in ONNX_OPS:
                raise Unsupported(f"{node.op_type} on tensors computed at run time (symfuse folds it on known values)")
            if outs is None:
                outs = ONNX_OPS[node.op_type](cx, on)
        except Unsupported as e:
            raise UnsupportedOpsError([(node.op_type, str(e), cx.loc)]) from None
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        for o, v in zip(node.output, outs):
            if o:  # numpy hands back a bare element for a 0-d result
                cx.env[o] = v if isinstance(v, (Value, np.ndarray, Sequence)) else np.array(v, dtype=object)

    results = []
    for o in g.output:
        v = cx.env.get(o.name)
        if v is None:
            raise ValueError(f"ONNX output '{o.name}' is not computed by any node")
        if isinstance(v, Sequence) or o.type.HasField("sequence_type"):
            raise UnsupportedOpsError(
                [("sequence output", f"ONNX output '{o.name}' is a sequence; symfuse returns tensors", "")]
            )
        cx.loc, cx.name = f"output '{o.name}'", _symbol_name(o.name)
        v = cx.tensor(v)
        want = o.type.tensor_type
        if want.elem_type and onnx_dtype(want.elem_type) != v.type.dtype:
            raise ValueError(
                f"ONNX output '{o.name}' is {onnx_dtype(want.elem_type)} in the model, symfuse computes "
                f"{v.type.dtype}: an import rule is wrong for this model"
            )
        if want.HasField("shape") and len(want.shape.dim) != v.type.rank:
            raise ValueError(
                f"ONNX output '{o.name}' has rank {len(want.shape.dim)} in the model, symfuse computes "
                f"{v.type.rank}: an import rule is wrong for this model"
            )
        results.append(v)
    graph = b.finish(results)
    _, spec = pytree.tree_flatten(tuple(range(len(results))))
    captured = Captured(graph, store, declared, [v.name for v in declared], {}, spec, 0.0)
    captured.output_names = [o.name for o in g.output]
    captured.seconds = time.perf_counter() - t0
    captured.stages = {"onnx load and check": t1 - t0, "conversion to symfuse's graph": time.perf_counter() - t1}
    captured.notes.append(f"imported from ONNX (opset {opset}, {len(g.node)} nodes); outputs in order: "
                          + ", ".join(captured.output_names))  # fmt: skip
    log.info("symfuse: imported ONNX graph %s in %.2fs", name, captured.seconds)
    return captured


__all__ = ["capture_onnx", "check_supported", "load_model"]
