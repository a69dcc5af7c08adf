"""Run a folder of ONNX test models (`<case>/model.onnx` + `<case>/test_data_set_*/`) through
ONNX Runtime and symfuse and count what each runs, and whether symfuse's answer matches.

The default folders are the collections the installed onnx package ships
(`onnx/backend/test/data/{pytorch-converted,pytorch-operator,simple}`: PyTorch modules and
operators as older and newer exporters wrote them, and hand-made models).

    .venv/bin/python -m tests.support.onnx_collection [FOLDER ...] [--show-failures]

tests/cpu/test_onnx_conformance.py runs the default collections with the same functions.

A model counts for symfuse when it compiles and every data set matches the expected output
(rtol 1e-3, atol 1e-5, the onnx backend tests' own tolerance); a refusal is symfuse's clear
error; "wrong" is a mismatch and must stay 0.
"""

from __future__ import annotations

import argparse
import collections
import glob
import os
import sys
import warnings

import numpy as np
import onnx
from onnx import numpy_helper


def collections_folders() -> list[str]:
    root = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
    return [os.path.join(root, d) for d in ("pytorch-converted", "pytorch-operator", "simple")]


def _read(path: str):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def data_sets(case: str) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    out = []
    for d in sorted(glob.glob(os.path.join(case, "test_data_set_*"))):
        ins = [_read(p) for p in sorted(glob.glob(os.path.join(d, "input_*.pb")), key=_index)]
        outs = [_read(p) for p in sorted(glob.glob(os.path.join(d, "output_*.pb")), key=_index)]
        out.append((ins, outs))
    return out


def _index(path: str) -> int:
    return int(os.path.basename(path).split("_")[1].split(".")[0])


def _matches(got, want) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        g = np.asarray(g)
        if g.shape != w.shape:
            return False
        if w.dtype.kind in "fc":
            if not np.allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-3, atol=1e-5, equal_nan=True):
                return False
        elif not np.array_equal(g, w):
            return False
    return True


def cases(folders=None) -> list[tuple[str, str]]:
    """(name, model path) of each case in `folders` (default: the onnx package's collections)."""
    out = []
    for folder in folders or collections_folders():
        for case in sorted(glob.glob(os.path.join(folder, "*", "model.onnx"))):
            out.append((f"{os.path.basename(folder)}/{os.path.basename(os.path.dirname(case))}", case))
    return out


def run_onnxruntime(model_path: str, sets) -> str:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)
    try:
        sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        for ins, outs in sets:
            got = sess.run(None, dict(zip(names, ins)))
            if not _matches(got, outs):
                return "wrong"
        return "pass"
    except Exception as e:  # noqa: BLE001
        return "error: " + str(e).strip().splitlines()[0][:200]


def run_symfuse(model_path: str, sets) -> str:
    import torch

    import symfuse
    from symfuse.errors import UnsupportedOpsError

    try:
        compiled = symfuse.compile(model_path)
        for ins, outs in sets:
            got = compiled(*[torch.from_numpy(np.array(x)) for x in ins])
            got = [got] if not isinstance(got, (tuple, list)) else got
            if not _matches([g.detach().numpy() for g in got], outs):
                return "wrong"
        return "pass"
    except (UnsupportedOpsError, ValueError, TypeError, NotImplementedError) as e:
        return "refused: " + " ".join(str(e).split())[:400]
    except Exception as e:  # noqa: BLE001
        return f"error: {type(e).__name__}: " + str(e).strip().splitlines()[0][:200]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", help="folders of cases (default: the onnx package's collections)")
    p.add_argument("--show-failures", action="store_true", help="print each failing case and why")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    counts = collections.Counter()
    wrong = []
    for name, case in cases(args.folders):
        sets = data_sets(os.path.dirname(case))
        o = run_onnxruntime(case, sets)
        s = run_symfuse(case, sets)
        counts["models"] += 1
        counts["onnxruntime"] += o == "pass"
        counts["symfuse"] += s == "pass"
        counts["both"] += o == "pass" and s == "pass"
        if s == "wrong":
            wrong.append(name)
        if args.show_failures and s != "pass":
            print(f"{name}: symfuse {s} | onnxruntime {o}", flush=True)
    print(
        f"{counts['models']} models: onnxruntime runs {counts['onnxruntime']}, symfuse runs {counts['symfuse']} "
        f"({counts['both']} of them both), symfuse wrong {len(wrong)}"
    )
    for name in wrong:
        print(f"  wrong: {name}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
